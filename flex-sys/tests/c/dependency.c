/*
 * dependency.c -- libflextestdep.so, a library that the stub built with
 * -DFLEX_TEST_NEEDS_DEPENDENCY links against. The loader tests never put its
 * directory on the search path, so the dynamic loader cannot find it.
 */
#include <stdint.h>

int32_t flex_test_dependency_device_count(void) { return 3; }
