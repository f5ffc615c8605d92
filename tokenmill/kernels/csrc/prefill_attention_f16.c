// prefill_attention.c over a float16 KV pool: tm_paged_attention_prefill_f16 (see paged_kv.h).
#define KV_F16 1
#include "prefill_attention.c"
