# Run by the layers_one_way test: builds each climbing target (must fail because the climbing
# header is not found) and each control (must build).
#   -DBUILD_DIR=<build tree> -DPAIRS=<layer>:<climbing header>;...
set(failures "")
foreach(pair IN LISTS PAIRS)
  string(REPLACE ":" ";" parts "${pair}")
  list(GET parts 0 layer)
  list(GET parts 1 header)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target shmdist_allowed_${layer}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    string(APPEND failures "control: a source of layer '${layer}' including a header it may use "
                           "did not build:\n${out}\n")
    continue()
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target shmdist_climb_${layer}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    string(APPEND failures "layer '${layer}' included \"${header}\" and built: its include view "
                           "lets it climb\n")
  elseif(NOT out MATCHES "${header}" OR NOT out MATCHES "No such file")
    string(APPEND failures "layer '${layer}' including \"${header}\" failed for another reason "
                           "than a missing header:\n${out}\n")
  else()
    message(STATUS "ok: ${layer} cannot include ${header}")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "${failures}")
endif()
