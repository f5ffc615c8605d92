// IEEE half precision (float16) for the KV cache: exact widening, round-to-nearest-even
// narrowing (torch's .to(torch.float16)). The vector builds convert with F16C; the scalar
// forms here give the same bits.
#pragma once
#include <stdint.h>
#include <string.h>
#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

static inline float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0x1fu) {
        bits = sign | 0x7f800000u | (m << 13);  // inf, NaN
    } else if (e != 0) {
        bits = sign | ((e + 112u) << 23) | (m << 13);
    } else if (m == 0) {
        bits = sign;
    } else {  // subnormal: m * 2^-24, normalized
        uint32_t s = 0;
        while (!(m & 0x400u)) m <<= 1, s++;
        bits = sign | ((113u - s) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu);  // NaN
    if (ax >= 0x47800000u) return sign | 0x7c00u;  // 65536 and above, inf: inf
    if (ax < 0x00800000u) return sign;             // float subnormals: below half's range
    const int32_t e = (int32_t)(ax >> 23) - 127;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;  // 24-bit significand
    const int32_t shift = e >= -14 ? 13 : -1 - e;     // to half's 11 bits, or its subnormals
    if (shift > 24) return sign;                       // under half the smallest subnormal
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++;  // a carry moves the exponent
    if (e < -14) return sign | (uint16_t)q;
    return sign | (uint16_t)(((uint32_t)(e + 15) << 10) + q - 0x400u);
}

// n floats to halves (rounded to nearest even).
static inline void floats_to_halves(const float* x, int64_t n, uint16_t* out) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i*)(out + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i*)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) out[i] = float_to_half(x[i]);
}

// Exported for tests: the scalar conversions (what a build without F16C runs).
void tm_halves_to_floats(const uint16_t* h, int64_t n, float* out);
void tm_floats_to_halves(const float* x, int64_t n, uint16_t* out, int vector);
