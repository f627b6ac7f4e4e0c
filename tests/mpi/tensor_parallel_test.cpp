// Tests for kshard/tensor_parallel.hpp (in progress).
