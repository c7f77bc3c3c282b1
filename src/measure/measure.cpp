// The measurement library: see allocator.hpp and harness.hpp.
