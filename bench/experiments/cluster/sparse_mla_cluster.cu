// Sparse MLA forward over a 2-CTA cluster: an experiment of issue 38, item 2 (not product code).
//
// Why a cluster: gluon_ws holds Q (64 KB) and two 64-row tiles (128 KB) in one CTA and splits the
// output's 512 columns between two consumers, which must then hand each other row maxima and P
// every pair; no third tile fits to hide a gather. Here the two CTAs of a cluster split D instead:
// CTA r holds columns [256 r, 256 r + 256) of Q and of every gathered row, computes its partial
// S_r = Q_r K_r^T, and the two exchange partial S through distributed shared memory (16 KB of fp32
// a tile, thread to thread in the accumulator's own layout). Both then hold the same S, the same
// softmax and P, and each adds P V_r to its own 64 x 256 accumulator: one math warpgroup per CTA
// owns the item, with no row max or P handed to another warpgroup. The halved rows leave room for
// four tile stages and two Q halves (the next item's Q loads under the current item), and the math
// warpgroup pipelines within itself (FlashAttention-3's order): the next tile's Q K^T is issued
// before this tile's softmax, this tile's P V before the next tile's exchange.
//
// Shared memory per CTA: Q halves 2 x 32 KB, tiles 4 x 32 KB, a receive slot 16 KB, barriers:
// 208 KB + 112 B (+ up to 1 KB of alignment for the 128-byte swizzle).
#include <cstdint>
#include <cuda_bf16.h>

#include "wgmma_ops.h"

namespace {

constexpr int BH = 64;             // heads per item
constexpr int BN = 64;             // KV rows per tile
constexpr int DH = 256;            // this CTA's columns of D
constexpr int NST = 4;             // tile stages
constexpr int TILE = BN * DH * 2;  // bytes of a tile (and of a Q half): 4 column blocks of 8 KB
constexpr int SX = 128 * 32 * 4;   // the receive slot: 32 fp32 of each of 128 threads
constexpr int OFF_Q = 0;
constexpr int OFF_KV = OFF_Q + 2 * TILE;
constexpr int OFF_SX = OFF_KV + NST * TILE;
constexpr int OFF_BAR = OFF_SX + SX;
constexpr int B_QFULL = 0;                 // + Q slot: Q landed (the producer's 128 threads' cp.async)
constexpr int B_QEMPTY = 2;                // + Q slot: the item's last Q K^T is done (128 arrivals)
constexpr int B_KVFULL = 4;                // + stage (the producer's 128 threads' cp.async)
constexpr int B_KVEMPTY = B_KVFULL + NST;  // + stage (128 arrivals: the tile's P V is done)
constexpr int B_SFULL = B_KVEMPTY + NST;   // the partner's partial S landed here (16 KB of st.async)
constexpr int B_SFREE = B_SFULL + 1;       // the partner read what this CTA sent (one arrival)
constexpr int NB = B_SFREE + 1;
constexpr int SMEM_BYTES = OFF_BAR + NB * 8 + 1024;  // what the launcher asks for (SMEM in the .py)
static_assert(SMEM_BYTES <= 232448, "more shared memory than an sm90 block may have");
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t mapa(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
// an arrival on the partner CTA's barrier (cluster address), releasing this thread's prior accesses
__device__ __forceinline__ void mbar_arrive_remote(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}
__device__ __forceinline__ bool mbar_try(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ bool mbar_try_cluster(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try(bar, parity)) {
  }
}
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  while (!mbar_try_cluster(bar, parity)) {
  }
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// a wgmma shared-memory descriptor with the 128-byte swizzle (buffers 1024-byte aligned)
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}
// byte offset of 16-byte chunk `ch` (0..31) of row `r` in a [64 x 256] bf16 buffer laid out as four
// 64-column blocks of [64 rows x 128 B], 128-byte swizzle (chunk ^= row % 8)
__device__ __forceinline__ uint32_t swz(int r, int ch) {
  return (ch >> 3) * 8192 + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// S = Q_r K_r^T over this CTA's 256 columns (16 k-steps), issued and committed, not waited
__device__ __forceinline__ void issue_qk(float (&sa)[32], uint32_t qbase, uint32_t tile) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 16; ++kk) {
    const uint32_t off = (kk >> 2) * 8192 + (kk & 3) * 32;
    wgmma_ss_m64n64k16(sa, gmma_desc(qbase + off, 16, 1024), gmma_desc(tile + off, 16, 1024), kk > 0);
  }
  wgmma_commit();
}
// the validity of this thread's 16 columns of the tile at index column `col0` (PAD and past `len`: false)
__device__ __forceinline__ void load_valid(bool (&valid)[16], const int* irow, int col0, int len, int c) {
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const int col = col0 + 8 * (e >> 1) + 2 * c + (e & 1);
    // the load clamped into the row instead of skipped: no branch while wgmma are in flight (len >= 1 here)
    valid[e] = (col < len) & (__ldg(irow + min(col, len - 1)) >= 0);
  }
}
// this CTA's partial S to the partner and the partner's into sa (thread to thread: the partner's same thread
// holds the same entries). The stores signal the partner's barrier themselves (st.async, 16 KB of transactions);
// one thread arms this CTA's barrier for them and, once the warpgroup has read them, tells the partner its slot
// is free again (one arrival).
__device__ __forceinline__ void exchange(float (&sa)[32], uint32_t n, int tid, uint32_t sx_local, uint32_t sx_peer,
                                         uint32_t sfull, uint32_t sfree, uint32_t sfull_peer, uint32_t sfree_peer) {
  if (tid == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sfull), "r"(SX) : "memory");
  mbar_wait_cluster(sfree, (n & 1) ^ 1);  // the partner read what this CTA sent before
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
                 ::"r"(sx_peer + (v * 128 + tid) * 16), "f"(sa[4 * v]), "f"(sa[4 * v + 1]), "f"(sa[4 * v + 2]),
                 "f"(sa[4 * v + 3]), "r"(sfull_peer)
                 : "memory");
  }
  mbar_wait_cluster(sfull, n & 1);
#pragma unroll
  for (int v = 0; v < 8; ++v) {
    float x0, x1, x2, x3;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(x0), "=f"(x1), "=f"(x2), "=f"(x3) : "r"(sx_local + (v * 128 + tid) * 16) : "memory");
    // the same sum in both CTAs (fp32 addition commutes): both get the same softmax
    sa[4 * v] += x0;
    sa[4 * v + 1] += x1;
    sa[4 * v + 2] += x2;
    sa[4 * v + 3] += x3;
  }
  asm volatile("bar.sync 1, 128;" ::: "memory");  // the warpgroup's reads of the slot are done
  if (tid == 0) mbar_arrive_remote(sfree_peer);
}

}  // namespace

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256, 1)
    swa_sparse_mla_cluster(const __nv_bfloat16* __restrict__ Q, const __nv_bfloat16* __restrict__ KV,
                           const int* __restrict__ IDX, const int* __restrict__ LENS, const float* __restrict__ SINK,
                           __nv_bfloat16* __restrict__ OUT, float* __restrict__ LSE, int H, int NUM_HB,
                           int NUM_ITEMS, long long sqt, long long sqh, long long skv, long long sit, long long sot,
                           long long soh, long long slt, float qk_scale, int has_sink, int pv_lbo, int pv_sbo,
                           int flags) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t rank = cluster_rank();
  const uint32_t peer = rank ^ 1u;
  const int cid = blockIdx.x >> 1;
  const int ncl = gridDim.x >> 1;
  const int wg = threadIdx.x >> 7;
  const int tid = threadIdx.x & 127;
  auto bar = [&](int i) { return base + OFF_BAR + i * 8; };

  if (threadIdx.x == 0) {
    for (int i = 0; i < 2; ++i) {
      mbar_init(bar(B_QFULL + i), 128);
      mbar_init(bar(B_QEMPTY + i), 128);
    }
    for (int i = 0; i < NST; ++i) {
      mbar_init(bar(B_KVFULL + i), 128);
      mbar_init(bar(B_KVEMPTY + i), 128);
    }
    mbar_init(bar(B_SFULL), 1);  // this CTA's arming arrival; the partner's stores complete the bytes
    mbar_init(bar(B_SFREE), 1);  // one arrival of the partner's once its warpgroup read the slot
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  cluster_sync();  // the partner's barriers exist before anything arrives on them

  if (wg == 0) {
    // ---------------- producer: 4 warps, 16 rows each a tile; a warp instruction moves 512 bytes of a row
    const int pw = tid >> 5;
    const int lane = tid & 31;
    const long long col0 = static_cast<long long>(rank) * DH + lane * 8;
    int k = 0;
    uint32_t n = 0;
    for (int item = cid; item < NUM_ITEMS; item += ncl, ++k) {
      const int hb = item % NUM_HB;
      const long long t = item / NUM_HB;
      const int len = LENS[t];
      const int qs = k & 1;
      mbar_wait(bar(B_QEMPTY + qs), ((k >> 1) & 1) ^ 1);
      const uint32_t qdst = base + OFF_Q + qs * TILE;
#pragma unroll 4
      for (int j = 0; j < 16; ++j) {
        const int r = pw * 16 + j;
        const int h = hb * BH + r;
        const bool ok = h < H;
        cp_async16(qdst + swz(r, lane), Q + t * sqt + (ok ? h : 0) * sqh + col0, ok ? 16u : 0u);
      }
      cp_async_arrive(bar(B_QFULL + qs));
      const int* irow = IDX + t * sit;
      const int ntiles = (len + BN - 1) / BN;
      for (int i = 0; i < ntiles; ++i, ++n) {
        const int s = n % NST;
        mbar_wait(bar(B_KVEMPTY + s), ((n / NST) & 1) ^ 1);
        const int col = i * BN + pw * 16 + (lane & 15);
        const int ix = col < len ? irow[col] : -1;
        const uint32_t dst = base + OFF_KV + s * TILE;
#pragma unroll 4
        for (int j = 0; j < 16; ++j) {
          const int rj = __shfl_sync(0xffffffffu, ix, j);
          const bool ok = rj >= 0;
          if (!(flags & 4))  // ablation: no gathers (the tile keeps what it held)
            cp_async16(dst + swz(pw * 16 + j, lane), KV + (ok ? rj : 0) * skv + col0, ok ? 16u : 0u);
        }
        cp_async_arrive(bar(B_KVFULL + s));
      }
    }
  } else {
    // ---------------- math: one warpgroup, the whole item
    const int wi = tid >> 5;
    const int lane = tid & 31;
    const int g = lane >> 2;
    const int c = lane & 3;
    const uint32_t sx_local = base + OFF_SX;
    const uint32_t sx_peer = mapa(sx_local, peer);
    const uint32_t sfull_peer = mapa(bar(B_SFULL), peer);
    const uint32_t sfree_peer = mapa(bar(B_SFREE), peer);
    int k = 0;
    uint32_t n = 0;   // tiles before this one (stages, exchanges)
    for (int item = cid; item < NUM_ITEMS; item += ncl, ++k) {
      const int hb = item % NUM_HB;
      const long long t = item / NUM_HB;
      const int len = LENS[t];
      const int* irow = IDX + t * sit;
      const int ntiles = (len + BN - 1) / BN;
      const int qs = k & 1;
      const uint32_t qbase = base + OFF_Q + qs * TILE;
      float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
      float acc[128];
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      float sa[32];
      bool valid[16];
      mbar_wait(bar(B_QFULL + qs), (k >> 1) & 1);
      if (ntiles == 0) {
        mbar_arrive(bar(B_QEMPTY + qs));
      } else {  // the first tile's scores: Q K^T, then the exchange
        mbar_wait(bar(B_KVFULL + n % NST), (n / NST) & 1);
        fence_proxy_async();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
        issue_qk(sa, qbase, base + OFF_KV + (n % NST) * TILE);
        load_valid(valid, irow, 0, len, c);
        wgmma_wait<0>();
        fence_regs(sa);
        if (!(flags & 2)) exchange(sa, n, tid, sx_local, sx_peer, bar(B_SFULL), bar(B_SFREE), sfull_peer, sfree_peer);
      }
      for (int i = 0; i < ntiles; ++i, ++n) {
        // sa: tile i's whole S (both CTAs' halves summed); nothing in flight
        float sb[32];
        const bool more = i + 1 < ntiles;
        // the next tile's Q K^T on the tensor cores under this tile's softmax; on the last tile a Q K^T of the
        // same tile again, unused, so that every tile issues and waits alike (a wgmma in a branch, or waits that
        // differ by branch, make ptxas serialise the wgmma: C7518)
        const uint32_t n1 = more ? n + 1 : n;
        if (more) mbar_wait(bar(B_KVFULL + n1 % NST), (n1 / NST) & 1);
        fence_proxy_async();
        issue_qk(sb, qbase, base + OFF_KV + (n1 % NST) * TILE);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool ok = valid[2 * j + e];
            sa[4 * j + e] = ok ? sa[4 * j + e] : -INFINITY;
            sa[4 * j + 2 + e] = ok ? sa[4 * j + 2 + e] : -INFINITY;
            mx0 = fmaxf(mx0, sa[4 * j + e]);
            mx1 = fmaxf(mx1, sa[4 * j + 2 + e]);
          }
        }
        if (more) load_valid(valid, irow, (i + 1) * BN, len, c);  // the next tile's, under its Q K^T
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0 * qk_scale);
        const float mn1 = fmaxf(m1, mx1 * qk_scale);
        const float sh0 = mn0 == -INFINITY ? 0.f : mn0;
        const float sh1 = mn1 == -INFINITY ? 0.f : mn1;
        const float al0 = exp2f(m0 - sh0);
        const float al1 = exp2f(m1 - sh1);
        float rs0 = 0.f, rs1 = 0.f;
        uint32_t pa[16];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float p0 = exp2f(fmaf(sa[4 * j], qk_scale, -sh0));
          const float p1 = exp2f(fmaf(sa[4 * j + 1], qk_scale, -sh0));
          const float p2 = exp2f(fmaf(sa[4 * j + 2], qk_scale, -sh1));
          const float p3 = exp2f(fmaf(sa[4 * j + 3], qk_scale, -sh1));
          rs0 += p0 + p1;
          rs1 += p2 + p3;
          pa[2 * j] = pack_bf16(p0, p1);      // row g
          pa[2 * j + 1] = pack_bf16(p2, p3);  // row g + 8
        }
        l0 = l0 * al0 + rs0;
        l1 = l1 * al1 + rs1;
        m0 = mn0;
        m1 = mn1;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          acc[4 * j] *= al0;
          acc[4 * j + 1] *= al0;
          acc[4 * j + 2] *= al1;
          acc[4 * j + 3] *= al1;
        }
        const uint32_t tile = base + OFF_KV + (n % NST) * TILE;
        fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          // rows 16 kk .. 16 kk + 15 of the tile: two 8-row swizzle atoms (2 KB)
          wgmma_rs_m64n256k16(acc, pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3],
                              gmma_desc(tile + kk * 2048, pv_lbo, pv_sbo));
        }
        wgmma_commit();
        wgmma_wait<1>();  // the next tile's Q K^T (this P V may still run)
        fence_regs(sb);
        if (!more) mbar_arrive(bar(B_QEMPTY + qs));  // the item's last read of Q
        // the next tile's scores, exchanged under this P V
        if (more && !(flags & 2))
          exchange(sb, n + 1, tid, sx_local, sx_peer, bar(B_SFULL), bar(B_SFREE), sfull_peer, sfree_peer);
        // this P V done before the next iteration: a group left pending across the loop's back edge makes ptxas
        // serialise every wgmma (C7514), and the next Q K^T is issued right after this anyway
        wgmma_wait<0>();
        fence_regs(acc);
        mbar_arrive(bar(B_KVEMPTY + n % NST));
#pragma unroll
        for (int e = 0; e < 32; ++e) sa[e] = sb[e];
      }
      // epilogue: the quad's row sums, the sink in the denominator only, O and (rank 0) the lse
      l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
      l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
      l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
      l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
      const int h0 = hb * BH + wi * 16 + g;
      const int h1 = h0 + 8;
      float inv[2];
      const float ls[2] = {l0, l1};
      const float ms[2] = {m0, m1};
      const int hs[2] = {h0, h1};
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const bool has = ls[q] > 0.f;
        const float sh = ms[q] == -INFINITY ? 0.f : ms[q];
        const float sink2 = (has_sink && hs[q] < H) ? SINK[hs[q]] * LOG2E : -INFINITY;
        inv[q] = 1.f / (has ? ls[q] + exp2f(sink2 - sh) : 1.f);
        if (rank == 0 && c == 0 && hs[q] < H)
          LSE[t * slt + hs[q]] = has ? (ms[q] + log2f(ls[q])) * LN2 : -INFINITY;
      }
      __nv_bfloat16* o0 = OUT + t * sot + static_cast<long long>(h0) * soh + rank * DH + 2 * c;
      __nv_bfloat16* o1 = o0 + 8 * soh;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        if (h0 < H)
          *reinterpret_cast<__nv_bfloat162*>(o0 + 8 * j) = __floats2bfloat162_rn(acc[4 * j] * inv[0],
                                                                                  acc[4 * j + 1] * inv[0]);
        if (h1 < H)
          *reinterpret_cast<__nv_bfloat162*>(o1 + 8 * j) = __floats2bfloat162_rn(acc[4 * j + 2] * inv[1],
                                                                                  acc[4 * j + 3] * inv[1]);
      }
    }
  }
  __syncwarp();
  cluster_sync();  // no CTA leaves while its partner may still arrive on its barriers
}
