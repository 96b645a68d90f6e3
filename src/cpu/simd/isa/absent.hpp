// The x86 vector vocabulary on a target that lacks it (scalar, neon): declared so that the
// algorithms read the same on every target and compile everywhere, defined nowhere. Every use
// sits behind the constant that says the target has the unit (kKvVector, kI8Vector,
// kRegisterTranspose, kEvenOddBf16: `if constexpr`), so none is ever called; one that a
// constant failed to select out is a link error, not a wrong number. Part of the floor (isa.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "attnlab/dtype.hpp"
#include "attnlab/kv_quant.hpp"

namespace attnlab::ATTN_TARGET_NS::simd {

struct AbsentReg {};

using FloatReg = Batch;
void transpose_block(FloatReg* r);
void load_even_odd(const bf16* p, Batch& even, Batch& odd);
Batch trunc_float(Batch y);
Batch f16_at(const std::byte* const* p, int64_t off);
Batch spread_keys(Batch v, int g);
template <bool Max>
Batch reduce4(Batch a, Batch b, Batch c, Batch d);
Batch group_sums(const Batch a[4]);

namespace kv_detail {
using IntReg = AbsentReg;
using Fp8Words = AbsentReg;
IntReg u8_lanes(const std::byte* p);
IntReg i8_lanes(const std::byte* p);
IntReg nibble_pair_lanes(const std::byte* p);
Batch to_floats(IntReg x);
IntReg srl(IntReg x, int n);
IntReg and_(IntReg x, int m);
Batch f16_scale(uint16_t bits);
Fp8Words fp8_words(const std::byte* p);
Batch e5m2_floats(Fp8Words w);
Batch e4m3_floats(Fp8Words w);
Batch e4m3_floats_scaled(Fp8Words w);
bool e4m3_nan_code_in(const std::byte* p, int64_t n);
}  // namespace kv_detail

namespace i8_detail {
using IVec = AbsentReg;
template <bool Vnni>
IVec dot4(IVec acc, IVec u, IVec s);
IVec abs8(IVec x);
IVec sign8(IVec s, IVec c);
Batch to_float(IVec x);
IVec load_ivec(const void* p);
void store_ivec(void* p, IVec x);
IVec izero();
IVec bcast32(int32_t x);
IVec halves(IVec lo, IVec hi);
inline constexpr int kSliceKeys = 1;  // (sizes arrays in discarded code only)
IVec slice_of(const std::byte* const* p, int64_t off, int64_t n);
IVec bcast_slice(const int8_t* q);
IVec lane0_of_each_key(int32_t x);
IVec xor80(IVec x);
IVec nibbles_lo(IVec x);
IVec nibbles_hi(IVec x);
IVec group_sums(const IVec a[4]);
template <bool Signed>
Batch round_to_codes(Batch y, uint8_t* out);
inline constexpr int kPvRows = 1;
template <KvDType T>
IVec v_codes(const std::byte* r, int64_t c0, int64_t rem);
template <KvDType T>
IVec key_bytes(const std::byte* r, int64_t t, int64_t d);
void transpose_words(IVec* x);
IVec lo8(IVec a, IVec b);
IVec hi8(IVec a, IVec b);
IVec lo16(IVec a, IVec b);
IVec hi16(IVec a, IVec b);
void column_order(const IVec x[4], IVec out[4]);
}  // namespace i8_detail

}  // namespace attnlab::ATTN_TARGET_NS::simd
