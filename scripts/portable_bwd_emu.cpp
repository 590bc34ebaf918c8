/* portable_bwd_emu.cpp - the portable backward's main kernel
 * (src/cuda/portable/bwd_portable.cuh) emulated on the host, warp by warp:
 * ldmatrix (.trans) and mma.sync m16n8k16 with the fragment layouts of the
 * PTX ISA, the kernel's swizzle, ldmatrix lane patterns, warp roles, masks
 * and dQ accumulator order (bwd_dq_index) copied by hand, against a double
 * backward.  It checks the layouts before a GPU run, not rounding (values
 * stay float, so a right kernel gives ~1e-7); keep it in step with the kernel.
 *   g++ -O2 -o /tmp/portable_bwd_emu scripts/portable_bwd_emu.cpp && /tmp/portable_bwd_emu */
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
using namespace std;

template <int D> static uint32_t swz(int r, int c) { return (uint32_t)(r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7)) * 2u; }
static uint32_t ldsm_addr(uint32_t tile, uint32_t row_bytes, int j, uint32_t y) {
    return tile + row_bytes + (uint32_t)(j >> 2) * 128u + ((((uint32_t)(j & 3) << 1) ^ y) << 4);
}
struct Smem { vector<float> e; float &at(uint32_t byte) { return e[byte / 2]; } };
typedef float Reg2[2]; // a "b16x2" register: two values
struct Frag4 { float v[4][2]; };
// ldmatrix x4: addr[lane] -> per lane 4 regs
static void ldsm(Smem &s, const uint32_t addr[32], Frag4 out[32], bool trans) {
    for (int m = 0; m < 4; ++m)
        for (int j = 0; j < 32; ++j) {
            for (int h = 0; h < 2; ++h) {
                int row, col;
                if (!trans) { row = j / 4; col = 2 * (j % 4) + h; }
                else { row = 2 * (j % 4) + h; col = j / 4; }
                uint32_t a = addr[m * 8 + row] + col * 2;
                out[j].v[m][h] = s.at(a);
            }
        }
}
// mma m16n8k16: d[lane][4] += A(16x16) B(16x8)
static void mma(float d[32][4], const Frag4 a[32], const float b0[32][2], const float b1[32][2]) {
    double A[16][16], B[16][8];
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; ++h) {
            A[g][2 * t + h] = a[l].v[0][h]; A[g + 8][2 * t + h] = a[l].v[1][h];
            A[g][2 * t + 8 + h] = a[l].v[2][h]; A[g + 8][2 * t + 8 + h] = a[l].v[3][h];
            B[2 * t + h][g] = b0[l][h]; B[2 * t + 8 + h][g] = b1[l][h];
        }
    }
    for (int l = 0; l < 32; ++l) {
        int g = l / 4, t = l % 4;
        for (int e = 0; e < 4; ++e) {
            int r = g + 8 * (e >> 1), c = 2 * t + (e & 1);
            double acc = 0; for (int k = 0; k < 16; ++k) acc += A[r][k] * B[k][c];
            d[l][e] += (float)acc;
        }
    }
}
static float bf(float x) { return x; } /* no rounding: a layout check */

struct Prob { int B, Sq, Sk, Hq, Hkv, causal; };

template <int D>
static double run(const Prob &P, unsigned seed, int pw256 = 64) {
    const int BM = 64, BN = 64, NW = 8;
    const int WK = BN / 16, WQ = NW / WK, QW = BM / WQ, DW = D / WQ, WM = BM / 16, CW = D / (NW / WM);
    const int PW = D == 256 ? pw256 : CW <= 64 ? CW : CW % 64 == 0 ? 64 : 48;
    const int NQS = D == 256 ? 2 : 1, QS = QW / NQS;
    srand(seed);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2 - 1; };
    int group = P.Hq / P.Hkv;
    // tensors BSHD
    vector<float> q((size_t)P.B * P.Sq * P.Hq * D), k((size_t)P.B * P.Sk * P.Hkv * D), v(k.size()), dO(q.size());
    for (auto *t : {&q, &k, &v, &dO})
        for (auto &x : *t) x = rnd();
    float scale = 1.f / sqrtf((float)D);
    auto Q = [&](int b, int i, int h, int c) -> float & { return q[(((size_t)b * P.Sq + i) * P.Hq + h) * D + c]; };
    auto DO = [&](int b, int i, int h, int c) -> float & { return dO[(((size_t)b * P.Sq + i) * P.Hq + h) * D + c]; };
    auto K = [&](int b, int j, int h, int c) -> float & { return k[(((size_t)b * P.Sk + j) * P.Hkv + h) * D + c]; };
    auto V = [&](int b, int j, int h, int c) -> float & { return v[(((size_t)b * P.Sk + j) * P.Hkv + h) * D + c]; };
    int off = P.Sk - P.Sq;
    // reference
    vector<double> rdq(q.size()), rdk(k.size()), rdv(k.size()), lse((size_t)P.B * P.Hq * P.Sq), dsumv(lse.size());
    for (int b = 0; b < P.B; ++b) for (int h = 0; h < P.Hq; ++h) {
        int hk = h / group;
        for (int i = 0; i < P.Sq; ++i) {
            vector<double> s(P.Sk), pr(P.Sk), dp(P.Sk);
            double mx = -INFINITY;
            for (int j = 0; j < P.Sk; ++j) {
                if (P.causal && j > i + off) { s[j] = -INFINITY; continue; }
                double a = 0; for (int c = 0; c < D; ++c) a += (double)Q(b, i, h, c) * K(b, j, hk, c);
                s[j] = a * scale; mx = max(mx, s[j]);
            }
            double l = 0; for (int j = 0; j < P.Sk; ++j) { pr[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx); l += pr[j]; }
            double L = l == 0 ? -INFINITY : mx + log(l);
            lse[((size_t)b * P.Hq + h) * P.Sq + i] = L;
            for (int j = 0; j < P.Sk; ++j) pr[j] = l == 0 ? 0 : pr[j] / l;
            vector<double> o(D, 0.0); for (int j = 0; j < P.Sk; ++j) for (int c = 0; c < D; ++c) o[c] += pr[j] * V(b, j, hk, c);
            double Dd = 0; for (int c = 0; c < D; ++c) Dd += o[c] * DO(b, i, h, c);
            dsumv[((size_t)b * P.Hq + h) * P.Sq + i] = Dd;
            for (int j = 0; j < P.Sk; ++j) {
                double a = 0; for (int c = 0; c < D; ++c) a += (double)DO(b, i, h, c) * V(b, j, hk, c);
                double ds = pr[j] * (a - Dd);
                for (int c = 0; c < D; ++c) {
                    rdq[(((size_t)b * P.Sq + i) * P.Hq + h) * D + c] += scale * ds * K(b, j, hk, c);
                    rdk[(((size_t)b * P.Sk + j) * P.Hkv + hk) * D + c] += scale * ds * Q(b, i, h, c);
                    rdv[(((size_t)b * P.Sk + j) * P.Hkv + hk) * D + c] += pr[j] * DO(b, i, h, c);
                }
            }
        }
    }
    // workspace (pre kernel)
    int m_blocks = (P.Sq + 63) / 64;
    size_t blocks = (size_t)P.B * P.Hq * m_blocks;
    vector<float> lse2(blocks * 64, INFINITY), dsw(blocks * 64, 0.f), acc(blocks * 64 * D, 0.f);
    for (int b = 0; b < P.B; ++b) for (int h = 0; h < P.Hq; ++h) for (int i = 0; i < P.Sq; ++i) {
        size_t row = ((size_t)b * P.Hq + h) * m_blocks * 64 + i;
        double L = lse[((size_t)b * P.Hq + h) * P.Sq + i];
        lse2[row] = L == -INFINITY ? INFINITY : (float)(L * 1.4426950408889634);
        dsw[row] = (float)dsumv[((size_t)b * P.Hq + h) * P.Sq + i];
    }
    vector<float> odk(k.size()), odv(k.size());
    float scale_log2 = scale * 1.4426950408889634f;
    const uint32_t KV_B = BN * D * 2, QT_B = BM * D * 2, PT_B = BN * BM * 2;
    const uint32_t O_K = 0, O_V = KV_B, O_Q = 2 * KV_B, O_DO = O_Q + QT_B, O_P = O_DO + QT_B, O_DS = O_P + PT_B;
    int nblk = (P.Sk + BN - 1) / BN;
    for (int b = 0; b < P.B; ++b) for (int hk = 0; hk < P.Hkv; ++hk) for (int n_block = 0; n_block < nblk; ++n_block) {
        Smem sm; sm.e.assign((O_DS + PT_B) / 2, 0.f);
        int len_q = P.Sq, len_k = P.Sk;
        int n0 = n_block * BN;
        int m_end = (len_q + BM - 1) / BM, m_first = 0;
        if (P.causal) { int fq = n0 - off; m_first = fq <= 0 ? 0 : min(fq / BM, m_end); }
        int nm = m_end - m_first, T = nm * group;
        // load K, V (swizzled), zero rows past len_k
        for (int r = 0; r < BN; ++r) for (int c = 0; c < D; ++c) {
            bool ok = n0 + r < len_k;
            sm.at(O_K + swz<D>(r, c)) = ok ? K(b, n0 + r, hk, c) : 0.f;
            sm.at(O_V + swz<D>(r, c)) = ok ? V(b, n0 + r, hk, c) : 0.f;
        }
        // per-thread dv, dk: [warp][lane][DW/8][4]
        vector<float> dv(NW * 32 * (DW / 8) * 4, 0.f), dk(dv.size(), 0.f);
        auto DV = [&](int w, int l, int j, int e) -> float & { return dv[(((size_t)w * 32 + l) * (DW / 8) + j) * 4 + e]; };
        auto DK = [&](int w, int l, int j, int e) -> float & { return dk[(((size_t)w * 32 + l) * (DW / 8) + j) * 4 + e]; };
        for (int it = 0; it < T; ++it) {
            int h = hk * group + it / nm, m = m_first + it % nm, r0 = m * BM;
            for (int r = 0; r < BM; ++r) for (int c = 0; c < D; ++c) {
                bool ok = r0 + r < len_q;
                sm.at(O_Q + swz<D>(r, c)) = ok ? Q(b, r0 + r, h, c) : 0.f;
                sm.at(O_DO + swz<D>(r, c)) = ok ? DO(b, r0 + r, h, c) : 0.f;
            }
            size_t tile = ((size_t)b * P.Hq + h) * m_blocks + m;
            const float *l2s = &lse2[tile * 64], *dss = &dsw[tile * 64];
            // phase 1
            for (int warp = 0; warp < NW; ++warp)
            for (int qs = 0; qs < NQS; ++qs) {
                int kg = warp % WK, qg = warp / WK, qw0 = qg * QW + qs * QS;
                static float st[32][64][4], dpt[32][64][4];
                for (int l = 0; l < 32; ++l) for (int j = 0; j < QS / 8; ++j) for (int e = 0; e < 4; ++e) st[l][j][e] = dpt[l][j][e] = 0;
                for (int kk = 0; kk < D / 16; ++kk) {
                    uint32_t ad[32]; Frag4 ka[32], va[32];
                    for (int lane = 0; lane < 32; ++lane) {
                        uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                        ad[lane] = ldsm_addr(O_K, (kg * 16 + pa_r) * D * 2, kk, pa_y);
                    }
                    ldsm(sm, ad, ka, false);
                    for (int lane = 0; lane < 32; ++lane) {
                        uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                        ad[lane] = ldsm_addr(O_V, (kg * 16 + pa_r) * D * 2, kk, pa_y);
                    }
                    ldsm(sm, ad, va, false);
                    for (int nn = 0; nn < QS / 16; ++nn) {
                        Frag4 qb[32], ob[32];
                        for (int lane = 0; lane < 32; ++lane) {
                            uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pb_r = x7 + hi4 * 8, pb_y = x7 ^ hi3;
                            ad[lane] = ldsm_addr(O_Q, (qw0 + nn * 16 + pb_r) * D * 2, kk, pb_y);
                        }
                        ldsm(sm, ad, qb, false);
                        for (int lane = 0; lane < 32; ++lane) {
                            uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pb_r = x7 + hi4 * 8, pb_y = x7 ^ hi3;
                            ad[lane] = ldsm_addr(O_DO, (qw0 + nn * 16 + pb_r) * D * 2, kk, pb_y);
                        }
                        ldsm(sm, ad, ob, false);
                        float b0[32][2], b1[32][2], c[32][4];
                        for (int half = 0; half < 2; ++half) {
                            for (int l = 0; l < 32; ++l) for (int x = 0; x < 2; ++x) { b0[l][x] = qb[l].v[2 * half][x]; b1[l][x] = qb[l].v[2 * half + 1][x]; }
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) c[l][e] = st[l][2 * nn + half][e];
                            mma(c, ka, b0, b1);
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) st[l][2 * nn + half][e] = c[l][e];
                            for (int l = 0; l < 32; ++l) for (int x = 0; x < 2; ++x) { b0[l][x] = ob[l].v[2 * half][x]; b1[l][x] = ob[l].v[2 * half + 1][x]; }
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) c[l][e] = dpt[l][2 * nn + half][e];
                            mma(c, va, b0, b1);
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) dpt[l][2 * nn + half][e] = c[l][e];
                        }
                    }
                }
                for (int lane = 0; lane < 32; ++lane) {
                    int g = lane / 4, t = lane % 4;
                    int key_lo = n0 + kg * 16 + g;
                    bool need_mask = n0 + BN > len_k || (P.causal && n0 + BN - 1 > m * BM + off);
                    for (int j = 0; j < QS / 8; ++j) {
                        int qc = qw0 + 8 * j + 2 * t;
                        for (int e = 0; e < 4; ++e) {
                            float s = st[lane][j][e] * scale_log2;
                            if (need_mask) {
                                int key = key_lo + 8 * (e >> 1), row = m * BM + qc + (e & 1);
                                if (key >= len_k || (P.causal && key > row + off)) s = -INFINITY;
                            }
                            float pe = exp2f(s - l2s[qc + (e & 1)]);
                            st[lane][j][e] = pe;
                            dpt[lane][j][e] = pe * (dpt[lane][j][e] - dss[qc + (e & 1)]);
                        }
                        for (int r = 0; r < 2; ++r) {
                            uint32_t at = swz<BM>(kg * 16 + g + 8 * r, qc);
                            sm.at(O_P + at) = bf(st[lane][j][2 * r]); sm.at(O_P + at + 2) = bf(st[lane][j][2 * r + 1]);
                            sm.at(O_DS + at) = bf(dpt[lane][j][2 * r]); sm.at(O_DS + at + 2) = bf(dpt[lane][j][2 * r + 1]);
                        }
                    }
                }
            }
            // phase 2
            for (int warp = 0; warp < NW; ++warp) {
                int kg = warp % WK, qg = warp / WK;
                for (int kk = 0; kk < BM / 16; ++kk) {
                    uint32_t ad[32]; Frag4 pa[32], sa[32];
                    for (int lane = 0; lane < 32; ++lane) {
                        uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                        ad[lane] = ldsm_addr(O_P, (kg * 16 + pa_r) * BM * 2, kk, pa_y);
                    }
                    ldsm(sm, ad, pa, false);
                    for (int lane = 0; lane < 32; ++lane) {
                        uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                        ad[lane] = ldsm_addr(O_DS, (kg * 16 + pa_r) * BM * 2, kk, pa_y);
                    }
                    ldsm(sm, ad, sa, false);
                    for (int dn = 0; dn < DW / 16; ++dn) {
                        int cj = qg * (DW / 16) + dn;
                        Frag4 ob[32], qb[32];
                        for (int lane = 0; lane < 32; ++lane) {
                            uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                            ad[lane] = ldsm_addr(O_DO, (kk * 16 + pa_r) * D * 2, cj, pa_y);
                        }
                        ldsm(sm, ad, ob, true);
                        for (int lane = 0; lane < 32; ++lane) {
                            uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                            ad[lane] = ldsm_addr(O_Q, (kk * 16 + pa_r) * D * 2, cj, pa_y);
                        }
                        ldsm(sm, ad, qb, true);
                        float b0[32][2], b1[32][2], c[32][4];
                        for (int half = 0; half < 2; ++half) {
                            for (int l = 0; l < 32; ++l) for (int x = 0; x < 2; ++x) { b0[l][x] = ob[l].v[2 * half][x]; b1[l][x] = ob[l].v[2 * half + 1][x]; }
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) c[l][e] = DV(warp, l, 2 * dn + half, e);
                            mma(c, pa, b0, b1);
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) DV(warp, l, 2 * dn + half, e) = c[l][e];
                            for (int l = 0; l < 32; ++l) for (int x = 0; x < 2; ++x) { b0[l][x] = qb[l].v[2 * half][x]; b1[l][x] = qb[l].v[2 * half + 1][x]; }
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) c[l][e] = DK(warp, l, 2 * dn + half, e);
                            mma(c, sa, b0, b1);
                            for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) DK(warp, l, 2 * dn + half, e) = c[l][e];
                        }
                    }
                }
            }
            // phase 3
            float *dq_tile = &acc[tile * BM * D];
            for (int warp = 0; warp < NW; ++warp) {
                int mg = warp % WM, cg = warp / WM;
                for (int pc = 0; pc < CW / PW; ++pc) {
                    static float dq[32][16][4];
                    for (int l = 0; l < 32; ++l) for (int j = 0; j < PW / 8; ++j) for (int e = 0; e < 4; ++e) dq[l][j][e] = 0;
                    for (int kk = 0; kk < BN / 16; ++kk) {
                        uint32_t ad[32]; Frag4 da[32];
                        for (int lane = 0; lane < 32; ++lane) {
                            uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pb_r = x7 + hi4 * 8, pb_y = x7 ^ hi3;
                            ad[lane] = ldsm_addr(O_DS, (kk * 16 + pb_r) * BM * 2, mg, pb_y);
                        }
                        ldsm(sm, ad, da, true);
                        for (int dn = 0; dn < PW / 16; ++dn) {
                            Frag4 kb[32];
                            for (int lane = 0; lane < 32; ++lane) {
                                uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4, pa_r = x7 + hi3 * 8, pa_y = x7 ^ hi4;
                                ad[lane] = ldsm_addr(O_K, (kk * 16 + pa_r) * D * 2, (cg * CW + pc * PW) / 16 + dn, pa_y);
                            }
                            ldsm(sm, ad, kb, true);
                            float b0[32][2], b1[32][2], c[32][4];
                            for (int half = 0; half < 2; ++half) {
                                for (int l = 0; l < 32; ++l) for (int x = 0; x < 2; ++x) { b0[l][x] = kb[l].v[2 * half][x]; b1[l][x] = kb[l].v[2 * half + 1][x]; }
                                for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) c[l][e] = dq[l][2 * dn + half][e];
                                mma(c, da, b0, b1);
                                for (int l = 0; l < 32; ++l) for (int e = 0; e < 4; ++e) dq[l][2 * dn + half][e] = c[l][e];
                            }
                        }
                    }
                    for (int lane = 0; lane < 32; ++lane)
                        for (int j = 0; j < PW / 8; ++j) {
                            float *at = dq_tile + ((mg * (D / 8) + (cg * CW + pc * PW) / 8 + j) * 32 + lane) * 4;
                            for (int e = 0; e < 4; ++e) at[e] += dq[lane][j][e];
                        }
                }
            }
        }
        // epilogue
        for (int warp = 0; warp < NW; ++warp) {
            int kg = warp % WK, qg = warp / WK;
            for (int lane = 0; lane < 32; ++lane) {
                int g = lane / 4, t = lane % 4;
                for (int r = 0; r < 2; ++r) {
                    int key = n0 + kg * 16 + g + 8 * r;
                    if (key >= len_k) continue;
                    for (int j = 0; j < DW / 8; ++j) for (int x = 0; x < 2; ++x) {
                        int c = qg * DW + 8 * j + 2 * t + x;
                        odk[(((size_t)b * P.Sk + key) * P.Hkv + hk) * D + c] = DK(warp, lane, j, 2 * r + x) * scale;
                        odv[(((size_t)b * P.Sk + key) * P.Hkv + hk) * D + c] = DV(warp, lane, j, 2 * r + x);
                    }
                }
            }
        }
    }
    // post: bwd_dq_index(row, col, width D)
    auto dqi = [](int row, int col, int width) {
        int part = col / width, c = col % width, wq = row / 16, r = row % 16;
        int lane = 4 * (r % 8) + (c % 8) / 2, e = 2 * (r / 8) + c % 2;
        return (((part * 4 + wq) * (width / 8) + c / 8) * 32 + lane) * 4 + e;
    };
    double err = 0, ref = 0;
    auto cmp = [&](double a, double r) { err = max(err, fabs(a - r)); ref = max(ref, fabs(r)); };
    for (int b = 0; b < P.B; ++b) for (int h = 0; h < P.Hq; ++h) for (int i = 0; i < P.Sq; ++i) for (int c = 0; c < D; ++c) {
        size_t bh = (size_t)b * P.Hq + h;
        float x = acc[(bh * m_blocks + i / 64) * 64 * D + dqi(i % 64, c, D)] * scale;
        cmp(x, rdq[(((size_t)b * P.Sq + i) * P.Hq + h) * D + c]);
    }
    double e_dq = err / ref; err = ref = 0;
    for (size_t i = 0; i < k.size(); ++i) cmp(odk[i], rdk[i]);
    double e_dk = err / ref; err = ref = 0;
    for (size_t i = 0; i < k.size(); ++i) cmp(odv[i], rdv[i]);
    double e_dv = err / ref;
    printf("D %d B %d Sq %d Sk %d Hq %d Hkv %d causal %d: rel max err dq %.2e dk %.2e dv %.2e\n", D, P.B, P.Sq, P.Sk, P.Hq, P.Hkv, P.causal, e_dq, e_dk, e_dv);
    return max(e_dq, max(e_dk, e_dv));
}

int main() {
    double w = 0;
    w = max(w, run<64>({1, 100, 130, 2, 1, 0}, 1));
    w = max(w, run<64>({2, 130, 77, 4, 2, 1}, 2));
    w = max(w, run<128>({1, 70, 150, 2, 2, 1}, 3));
    w = max(w, run<192>({1, 65, 64, 2, 1, 0}, 4));
    w = max(w, run<256>({1, 129, 100, 2, 1, 1}, 5, 64)); /* PBWD_PW256: sm_90a */
    w = max(w, run<256>({2, 70, 130, 4, 2, 0}, 7, 32));  /* sm_80 */
    w = max(w, run<64>({1, 200, 64, 1, 1, 1}, 6));
    printf("worst %.2e %s\n", w, w < 1e-4 ? "OK" : "FAIL");
}
