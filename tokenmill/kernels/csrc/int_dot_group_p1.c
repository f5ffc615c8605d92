// The integer-dot GEMV's tiles on the high plane (8-bit activations): int_dot_groups.h.
#define GROUP_PLANES 1
#include "int_dot_groups.h"
