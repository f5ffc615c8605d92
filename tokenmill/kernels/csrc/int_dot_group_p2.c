// The integer-dot GEMV's tiles on the high and middle planes (16-bit activations): int_dot_groups.h.
#define GROUP_PLANES 2
#include "int_dot_groups.h"
