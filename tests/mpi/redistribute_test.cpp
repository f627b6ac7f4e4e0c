// Tests for kshard/redistribute.hpp (in progress).
