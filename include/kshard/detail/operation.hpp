#pragma once

// The public kshard operation this process is running, named once at its entry point, so that
// MPI errors, the collective watchdog and agreement errors can say which operation failed.

namespace kshard::detail {

// Name of the running public operation ("gather", "vocab_parallel_lookup", ...), or nullptr.
inline const char*& current_operation() {
  static const char* name = nullptr;
  return name;
}

// Names the running operation for its lifetime; the outermost one wins (distribute constructs a
// DistMatrix: its collectives belong to distribute).
class Operation {
 public:
  explicit Operation(const char* name) : previous_(current_operation()) {
    if (previous_ == nullptr) current_operation() = name;
  }
  ~Operation() { current_operation() = previous_; }
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

 private:
  const char* previous_;
};

// The running operation's name for messages ("kshard" outside any operation).
inline const char* operation_name() {
  return current_operation() != nullptr ? current_operation() : "kshard";
}

}  // namespace kshard::detail
