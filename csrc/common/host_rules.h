// Message and pointer helpers of the kernel library's host-side rules (check_* in sonicmoe.h).
#pragma once

#include <cstdint>
#include <string>

namespace sonicmoe {

// "op: name = value breaks the rule: rule" (the torch layer uses the same wording).
inline std::string rule_message(const char* op, const char* name, int64_t value, const char* rule) {
  return std::string(op) + ": " + name + " = " + std::to_string(value) + " breaks the rule: " + rule;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace sonicmoe
