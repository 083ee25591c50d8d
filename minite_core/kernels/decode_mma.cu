// NVFP4 packed-weight decode GEMM on bf16 tensor cores (mma.sync m16n8k16): y[M, N] = x[M, K] @ ŵ[N, K]^T, M <= 16.
// Compiled at first use with NVRTC (kernels/decode_mma.py); no headers. The layout, the numerics and the launch
// are described in decode_mma.py's docstring; this file is the device code only.
//
// Weights: the "mma layout" of decode_mma.mma_layout — for every 16-row tile of N and 64-column chunk of K, 32 lanes
// x 16 bytes: lane (g = lane / 4, t = lane % 4) holds rows g and g + 8, columns 16t .. 16t + 15 of the chunk, as four
// 32-bit words (one per MMA k-step j), each the 8 nibbles of the lane's A fragment for that step; the scales of
// the same tile and chunk as 32 lanes x 2 bytes (rows g, g + 8 of block t). x is read in the same column order:
// MMA k-step j of a chunk multiplies physical columns 16t + 4j .. 16t + 4j + 3 of lane t — a permutation of K
// inside the chunk, the same for A and B, so each lane needs one scale per row a chunk and 32 contiguous bytes of x.

typedef unsigned int u32;
typedef unsigned short u16;

#define MAG 0x01C001C0u   // the e2m1 magnitude bits at a bf16's exponent bits 8..7 and mantissa bit 6, both halves
#define SIGN 0x80008000u  // the sign bits of both halves

struct __align__(16) U4 { u32 x, y, z, w; };

__device__ __forceinline__ U4 load_stream(const U4* p) {  // weights are read once: keep them out of L1
    U4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ float load_cg(const float* p) {  // another block's partial: from L2, not L1
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

__device__ __forceinline__ u32 mul_bf16x2(u32 a, u32 b) {  // a * b + (-0): exact where the product is a bf16
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(SIGN));
    return d;
}

// E4M3 byte (sign 0) -> bf16x2 {sf * 2^119, sf * 2^119}, exactly: the byte's exponent and mantissa bits land on
// fp32's (value sf * 2^-120, subnormals included), then two exact power-of-two multiplies.
__device__ __forceinline__ u32 scale_bf16x2(u32 byte) {
    float s = __uint_as_float(byte << 20) * 1.329227995784916e36f;  // * 2^120: sf
    s = s * 6.646139978924579e35f;                                   // * 2^119
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %1;" : "=r"(d) : "f"(s));
    return d;
}

// One 32-bit word of codes -> the 4 A registers of one k-step. Register r takes nibbles r (low half) and r + 4 (high
// half): their 3 magnitude bits shifted onto bf16 bits 8..6 give e2m1 * 2^-126 (0.5 as the subnormal 2^-127), the
// sign bit onto bit 15; times sf * 2^119 that is ŵ * 2^-7, exact (<= 5 significant bits, >= 2^-17).
__device__ __forceinline__ void dequant(u32 w, u32 s_lo, u32 s_hi, u32 (&a)[4]) {
    a[0] = mul_bf16x2(((w << 6) & MAG) | ((w << 12) & SIGN), s_lo);  // row g,     columns +0, +1
    a[1] = mul_bf16x2(((w << 2) & MAG) | ((w << 8) & SIGN), s_hi);   // row g + 8, columns +0, +1
    a[2] = mul_bf16x2(((w >> 2) & MAG) | ((w << 4) & SIGN), s_lo);   // row g,     columns +2, +3
    a[3] = mul_bf16x2(((w >> 6) & MAG) | (w & SIGN), s_hi);          // row g + 8, columns +2, +3
}

__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u16 to_bf16(float v) {
    u16 d;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(d) : "f"(v));
    return d;
}

// ---- the activation quantizer (W4A4), kernels/quantize.py's arithmetic op for op: 1x16 blocks, RNE, the
// block scale in DESIGN.md's `exact` or `fast` order; x̂ = e2m1(q) * sf exactly in bf16.
#define FLT_MAX_ 3.4028234663852886e38f
#define ONE_SIXTH 0.1666666716337204f

// S_enc = min(2688 / amax, FLT_MAX); amax == 0 or S_enc == 0 -> 1; a non-finite amax -> NaN (`_global_scales`)
__device__ __forceinline__ float global_s_enc(float amax) {
    float s = fminf(__fdiv_rn(2688.0f, amax), FLT_MAX_);
    if (amax == 0.0f || s == 0.0f) s = 1.0f;
    return amax <= FLT_MAX_ ? s : __int_as_float(0x7fffffff);
}

__device__ __forceinline__ float e4m3_rne(float v) {  // non-negative v <= 448 -> its E4M3 value (`_e4m3_rne`)
    if (v < 0.015625f) return __fsub_rn(__fadd_rn(v, 16384.0f), 16384.0f);  // subnormal step 2^-9
    const int b = __float_as_int(v);
    return __int_as_float((b + 0x7FFFF + ((b >> 20) & 1)) & -1048576);
}

__device__ __forceinline__ float e2m1_rne(float v) {  // v -> its E2M1 value, sign kept (`_e2m1_rne`)
    const float a = fminf(fabsf(v), 6.0f);
    const float step = a < 2.0f ? 0.5f : (a < 4.0f ? 1.0f : 2.0f);
    const float inv = a < 2.0f ? 2.0f : (a < 4.0f ? 1.0f : 0.5f);  // a / step, exactly: a power-of-two step
    const float r = __fsub_rn(__fadd_rn(__fmul_rn(a, inv), 8388608.0f), 8388608.0f);
    const float q = __fmul_rn(r, step);
    return v < 0.0f ? __fsub_rn(0.0f, q) : q;  // Triton's negation (0 - q): a zero stays +0, as the quantizer's x̂
}

__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

// One 16-column block of x (bf16, two 16-byte words in `in`) -> x̂ (bf16, two words in `out`); s_enc / s_dec = the
// row's global scales
template <bool FAST>
__device__ __forceinline__ void quantize_block(const U4* in, float s_enc, float s_dec, U4* out) {
    const u32 w[8] = {in[0].x, in[0].y, in[0].z, in[0].w, in[1].x, in[1].y, in[1].z, in[1].w};
    float v[16];
    float bamax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        v[2 * i] = bf16_lo(w[i]);
        v[2 * i + 1] = bf16_hi(w[i]);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        bamax = fmaxf(bamax, fabsf(v[i]));
        nan |= v[i] != v[i];
    }
    if (nan) bamax = __int_as_float(0x7fffffff);  // amax_nan: a NaN element makes the block's amax NaN
    const float hp = FAST ? fminf(__fmul_rn(s_enc, __fmul_rn(bamax, ONE_SIXTH)), 448.0f)
                          : fminf(__fmul_rn(bamax, __fmul_rn(s_enc, ONE_SIXTH)), 448.0f);
    float sf = e4m3_rne(hp);
    if (!(bamax <= FLT_MAX_ && s_enc <= FLT_MAX_)) sf = __int_as_float(0x7fffffff);
    const float enc_raw = __fdiv_rn(1.0f, __fmul_rn(sf, s_dec));
    const float enc = FAST ? (sf == 0.0f ? 0.0f : enc_raw) : fminf(enc_raw, FLT_MAX_);
    u32 o[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float lo = __fmul_rn(e2m1_rne(__fmul_rn(v[2 * i], enc)), sf);
        const float hi = __fmul_rn(e2m1_rne(__fmul_rn(v[2 * i + 1], enc)), sf);
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(o[i]) : "f"(hi), "f"(lo));
    }
    out[0] = {o[0], o[1], o[2], o[3]};
    out[1] = {o[4], o[5], o[6], o[7]};
}

// Epilogue of one output: acc * 2^7 (the dequantization's power of two), then * S_w (* S_x): the order of
// kernels/decode.py's.
template <bool OUT_F32, bool QUANT>
__device__ __forceinline__ void store(void* y, int stride_y, int m, int n, float acc, const float* sw,
                                      const float* sx, int flags) {
    float v = acc * 128.0f;
    const float s_w = (flags & 1) ? sw[n] : sw[0];
    if (QUANT) v = v * (__fdiv_rn(1.0f, global_s_enc(sx[m])) * s_w);  // the row's S_dec
    else if (flags & 2) v = v * (((flags & 4) ? sx[m] : sx[0]) * s_w);
    else v = v * s_w;
    if (OUT_F32) static_cast<float*>(y)[(size_t)m * stride_y + n] = v;
    else static_cast<u16*>(y)[(size_t)m * stride_y + n] = to_bf16(v);
}

// Grid (N / (16 WARPS), SPLIT); block WARPS warps, one 16-row tile of N each, all on the block's K slice of
// `slice_chunks` 64-column chunks. x's slice is staged in shared memory once for the block's warps (row stride
// padded by 16 bytes: conflict-free fragment loads). SPLIT > 1: fp32 partials to `part` [SPLIT, M, N]; the last
// block of a column of the grid (an atomic ticket) adds them in slice order and stores y: deterministic, one
// launch, capturable (its ticket returns to zero).
// flags: 1 = S_w per row of W, 2 = an S_x is given, 4 = S_x per row of x.
// QUANT: 0 = x as given (W4A16, or x̂ with its S_dec in sx); 1 / 2 = x (bf16) quantized while it is staged
// (`exact` / `fast` block scales), sx = one amax per row of x, S_dec of the row in the epilogue.
template <int MT, int WARPS, int UNROLL, bool OUT_F32, bool GROUPED, int QUANT>
__device__ __forceinline__ void tile_gemm(
    const U4* __restrict__ wq, const u16* __restrict__ ws, const u16* __restrict__ x,
    const float* __restrict__ sw, const float* __restrict__ sx, void* __restrict__ y,
    float* __restrict__ part, int* __restrict__ tickets,
    int M, int N, int chunks, int slice_chunks, int stride_x, int stride_y, int flags) {
    extern __shared__ U4 xs[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int c0 = blockIdx.y * slice_chunks;
    const int nc = min(slice_chunks, chunks - c0);
    const int row = slice_chunks * 8 + 1;  // x row stride in 16-byte units (a chunk is 8 of them) + 1 pad

    if (QUANT == 0) {
        for (int i = threadIdx.x; i < MT * 8 * nc * 8; i += WARPS * 32) {  // x[:, slice] -> shared, rows >= M zero
            const int r = i / (nc * 8), c = i - r * (nc * 8);
            U4 v = {0u, 0u, 0u, 0u};
            if (r < M) v = *reinterpret_cast<const U4*>(x + (size_t)r * stride_x + (size_t)c0 * 64 + c * 8);
            xs[r * row + c] = v;
        }
    } else {
        __shared__ float s_row[2][MT * 8];  // each row's S_enc, S_dec: once a block
        if (threadIdx.x < MT * 8 && threadIdx.x < M) {
            const float e = global_s_enc(sx[threadIdx.x]);
            s_row[0][threadIdx.x] = e;
            s_row[1][threadIdx.x] = __fdiv_rn(1.0f, e);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < MT * 8 * nc * 4; i += WARPS * 32) {  // one 16-column block a thread
            const int r = i / (nc * 4), b = i - r * (nc * 4);
            U4* q = xs + r * row + 2 * b;
            if (r < M) {
                quantize_block<QUANT == 2>(
                    reinterpret_cast<const U4*>(x + (size_t)r * stride_x + (size_t)c0 * 64 + b * 16),
                    s_row[0][r], s_row[1][r], q);
            } else {
                q[0] = q[1] = {0u, 0u, 0u, 0u};
            }
        }
    }
    __syncthreads();

    const int tile = blockIdx.x * WARPS + warp;  // this warp's 16 rows of N
    float acc[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
    if (tile * 16 < N) {
        const U4* wp = wq + ((size_t)tile * chunks + c0) * 32 + lane;
        const u16* sp = ws + ((size_t)tile * chunks + c0) * 32 + lane;
        for (int c = 0; c < nc; c += UNROLL) {
            U4 w[UNROLL];
            u32 s[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {  // every load of UNROLL chunks in flight before any arithmetic
                if (c + u < nc) {
                    w[u] = load_stream(wp + (size_t)(c + u) * 32);
                    s[u] = sp[(size_t)(c + u) * 32];
                }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (c + u < nc) {
                    const u32 s_lo = scale_bf16x2(s[u] & 0xFFu), s_hi = scale_bf16x2(s[u] >> 8);
                    U4 xb[MT][2];
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        const U4* p = xs + (mt * 8 + g) * row + (c + u) * 8 + 2 * t;
                        xb[mt][0] = p[0];
                        xb[mt][1] = p[1];
                    }
                    const u32 words[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        u32 a[4];
                        dequant(words[j], s_lo, s_hi, a);
#pragma unroll
                        for (int mt = 0; mt < MT; ++mt) {
                            const U4& b = xb[mt][j >> 1];
                            mma(acc[mt], a, (j & 1) ? b.z : b.x, (j & 1) ? b.w : b.y);
                        }
                    }
                }
            }
        }
    }

    // this lane's outputs: acc[mt][0..1] = rows g of the tile, x rows mt*8 + 2t, +1; acc[mt][2..3] = row g + 8
    const int n0 = tile * 16 + g;
    const int pitch = GROUPED ? MT * 8 : M;  // rows of a slice's partials
    if (gridDim.y > 1) {
        if (tile * 16 < N) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = mt * 8 + 2 * t + (i & 1), n = n0 + 8 * (i >> 1);
                    if (m < M) part[((size_t)blockIdx.y * pitch + m) * N + n] = acc[mt][i];
                }
        }
        __shared__ int last;
        __threadfence();  // this block's partials are visible before its ticket is taken
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(tickets + blockIdx.x, 1) == (int)gridDim.y - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (tile * 16 < N) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int m = mt * 8 + 2 * t + (i & 1), n = n0 + 8 * (i >> 1);
                    float v = 0.0f;
                    if (m < M)
                        for (int s = 0; s < (int)gridDim.y; ++s) v += load_cg(part + ((size_t)s * pitch + m) * N + n);
                    acc[mt][i] = v;
                }
        }
        if (threadIdx.x == 0) tickets[blockIdx.x] = 0;  // zero again for the next launch (graph replays)
    }
    if (tile * 16 < N) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int m = mt * 8 + 2 * t + (i & 1), n = n0 + 8 * (i >> 1);
                if (m < M) store<OUT_F32, QUANT != 0>(y, stride_y, m, n, acc[mt][i], sw, sx, flags);
            }
    }
}

// GROUPED: the MoE experts on the padded sorted layout (kernels/grouped.py grouped_schedule): grid.z is the
// schedule's upper bound of tiles of <= 16 rows of one expert (those past num_tiles exit), W and S_w indexed by the
// tile's expert, partials and tickets by the tile. (Programs looping over tiles, fewer of them, measured slower.)
template <int MT, int WARPS, int UNROLL, bool OUT_F32, bool GROUPED, int QUANT>
__global__ void __launch_bounds__(WARPS * 32) nvfp4_decode_mma(
    const U4* __restrict__ wq, const u16* __restrict__ ws, const u16* __restrict__ x,
    const float* __restrict__ sw, const float* __restrict__ sx, void* __restrict__ y,
    float* __restrict__ part, int* __restrict__ tickets,
    const int* __restrict__ tile_expert, const long long* __restrict__ tile_row,
    const long long* __restrict__ offs, const long long* __restrict__ num_tiles,
    int M, int N, int chunks, int slice_chunks, int stride_x, int stride_y, int stride_swe, int flags) {
    if (!GROUPED) {
        tile_gemm<MT, WARPS, UNROLL, OUT_F32, GROUPED, QUANT>(wq, ws, x, sw, sx, y, part, tickets, M, N, chunks,
                                                              slice_chunks, stride_x, stride_y, flags);
        return;
    }
    const long long z = blockIdx.z;
    if (z >= *num_tiles) return;
    const int e = tile_expert[z];
    const long long row0 = tile_row[z];
    const size_t w_expert = (size_t)(N / 16) * chunks * 32;
    tile_gemm<MT, WARPS, UNROLL, OUT_F32, GROUPED, QUANT>(
        wq + e * w_expert, ws + e * w_expert, x + row0 * stride_x, sw + (size_t)e * stride_swe,
        (flags & 4) ? sx + row0 : sx, static_cast<char*>(y) + row0 * stride_y * (OUT_F32 ? 4 : 2),
        part + (size_t)z * MT * 8 * N * gridDim.y, tickets + z * gridDim.x,
        (int)min((long long)(MT * 8), offs[e + 1] - row0), N, chunks, slice_chunks, stride_x, stride_y, flags);
}

// The activation quantizer on its own for a few rows (the decode GEMM's x̂ at 9-16 rows, where the fused one would be
// repeated by every block): one block a row. MODE 0: the row's amax (max |x|, NaN if any element is NaN) computed
// here; 1: one given amax (amax[0]); 2: one given amax a row. Writes x̂ = e2m1(q)·sf (bf16, [M, K] contiguous) and the
// row's S_dec — what the quantizer (kernels/quantize.py) emits for the same row and amax, bit for bit.
template <bool FAST, int MODE>
__global__ void __launch_bounds__(256) nvfp4_quantize_rows(const u16* __restrict__ x, const float* __restrict__ amax,
                                                         u16* __restrict__ xq, float* __restrict__ s_dec_out, int K,
                                                         int stride_x) {
    const int r = blockIdx.x;
    const U4* row = reinterpret_cast<const U4*>(x + (size_t)r * stride_x);
    U4* out = reinterpret_cast<U4*>(xq + (size_t)r * K);
    __shared__ float warp_max[8];
    __shared__ float row_amax;
    if (MODE == 0) {
        float m = 0.0f;
        bool nan = false;
        for (int i = threadIdx.x; i < K / 8; i += 256) {
            const U4 v = row[i];
            const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float a = bf16_lo(w[j]), b = bf16_hi(w[j]);
                m = fmaxf(m, fmaxf(fabsf(a), fabsf(b)));
                nan |= (a != a) | (b != b);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
        nan = __syncthreads_or(nan);
        if (threadIdx.x == 0) {
            float a = warp_max[0];
            for (int i = 1; i < 8; ++i) a = fmaxf(a, warp_max[i]);
            row_amax = nan ? __int_as_float(0x7fffffff) : a;
        }
        __syncthreads();
    }
    const float a = MODE == 0 ? row_amax : (MODE == 1 ? amax[0] : amax[r]);
    const float s_enc = global_s_enc(a), s_dec = __fdiv_rn(1.0f, s_enc);
    if (threadIdx.x == 0) s_dec_out[r] = s_dec;
    for (int b = threadIdx.x; b < K / 16; b += 256) quantize_block<FAST>(row + 2 * b, s_enc, s_dec, out + 2 * b);
}
