// exp(x) without a libm call, so loops over it vectorize: Cody-Waite range reduction and a
// degree-6 polynomial; relative error ~2e-7 over [-87, 88] (inputs are clamped there).
// decode_attention.c's vector versions compute the same sequence on 8 or 16 lanes.
#pragma once
#include <math.h>
#include <stdint.h>

static inline float poly_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}
