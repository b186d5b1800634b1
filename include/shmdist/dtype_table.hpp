// The dtype table: every dtype shmdist carries, one row each, in one place.
//
// Everything that lists dtypes expands from SHMDIST_DTYPES: the DType enum and kNumDTypes
// (shmdist/tensor.hpp), element sizes, torch names and kinds (lib/tensor/dtype.cpp), storage
// types and the conversion and printing switches (lib/tensor), the reduction kernels' switch
// (lib/coll/reduce.cpp), the torch adapter's ScalarType mapping (python/src/tensor_bridge.cpp).
// Frames and fingerprints carry the code; a code past the table is what a newer build sends
// (reported as a version mismatch, not as corruption).
//
// Adding a dtype: append one row with the next code (never renumber: codes travel between
// ranks). The compiler then points at what the row needs: a switch that expands the table
// and a template that has no case for the new kind of element (the conversion and reduction
// kernels) fail to build until they handle it.
//
// X(Name, code, ElementType, StorageType, torch_name, kind, TorchScalarType)
//   Name            the DType enumerator
//   code            its value: the byte frames, fingerprints and dtype_from_code use
//   ElementType     the C++ type of Tensor::data<T>() (shmdist::Half, shmdist::BFloat16, ...)
//   StorageType     how one element is held in memory (bool as a byte: any byte reads safely)
//   torch_name      what torch prints ("torch.float32")
//   kind            Bool, Integer or Floating (what reductions and conversions allow)
//   TorchScalarType the c10::ScalarType enumerator torch uses for it (the torch adapter's map)
#pragma once

#define SHMDIST_DTYPES(X)                                                                  \
  X(Bool, 0, bool, std::uint8_t, "torch.bool", Bool, Bool)                                  \
  X(UInt8, 1, std::uint8_t, std::uint8_t, "torch.uint8", Integer, Byte)                     \
  X(Int8, 2, std::int8_t, std::int8_t, "torch.int8", Integer, Char)                         \
  X(Int16, 3, std::int16_t, std::int16_t, "torch.int16", Integer, Short)                    \
  X(Int32, 4, std::int32_t, std::int32_t, "torch.int32", Integer, Int)                      \
  X(Int64, 5, std::int64_t, std::int64_t, "torch.int64", Integer, Long)                     \
  X(Float16, 6, ::shmdist::Half, std::uint16_t, "torch.float16", Floating, Half)            \
  X(BFloat16, 7, ::shmdist::BFloat16, std::uint16_t, "torch.bfloat16", Floating, BFloat16)  \
  X(Float32, 8, float, float, "torch.float32", Floating, Float)                             \
  X(Float64, 9, double, double, "torch.float64", Floating, Double)
