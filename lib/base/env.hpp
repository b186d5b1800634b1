// Reading launch variables from the environment, with errors that name the variable, the
// value found and what was expected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace shmdist::env {

inline constexpr const char* kSetByLauncher =
    "Start the program with 'shmrun -n N program', which sets it.";

// The variable's value, or nullopt when it is unset (an empty value counts as set).
std::optional<std::string> get(const char* name);
// Parses an integer in [min, max]; throws SetupError naming the variable otherwise, ending
// with `hint` (what the variable is for, or who sets it).
long long parse_int(const char* name, const std::string& value, long long min, long long max,
                    const char* hint = kSetByLauncher);
// get + parse_int; nullopt when unset.
std::optional<long long> get_int(const char* name, long long min, long long max);

}  // namespace shmdist::env
