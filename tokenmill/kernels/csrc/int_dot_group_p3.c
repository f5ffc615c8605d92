// The integer-dot GEMV's tiles on all three planes (24-bit activations): int_dot_groups.h.
#define GROUP_PLANES 3
#include "int_dot_groups.h"
