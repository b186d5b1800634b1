# cmake --install: headers, library, shmrun, shmdist-bench, the CMake package and pkg-config.
include(CMakePackageConfigHelpers)

install(TARGETS shmdist EXPORT shmdistTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/shmdist DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT shmdistTargets NAMESPACE shmdist:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shmdist)

configure_package_config_file(cmake/shmdistConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/shmdistConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shmdist)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/shmdistConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shmdistConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/shmdistConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shmdist)

# The .pc file finds the prefix relative to itself, so an installed tree can be moved.
file(RELATIVE_PATH SHMDIST_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" SHMDIST_PC_TO_PREFIX "${SHMDIST_PC_TO_PREFIX}")
configure_file(cmake/shmdist.pc.in ${CMAKE_CURRENT_BINARY_DIR}/shmdist.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shmdist.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
