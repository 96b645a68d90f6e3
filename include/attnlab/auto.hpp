// kernel "auto": the kernel the lab runs when the caller names none - the fastest one that runs the
// problem on this CPU within the problem's arithmetic class. The choice is one table (auto.cpp), each
// row derived from committed paired runs that it names; `attnlab list` prints it, and every caller
// that accepts "auto" (attnlab run / verify --impl auto, attnlab.attention, attnlab.torch,
// attnlab.hf and LabCache) reports the kernel that ran.
#pragma once

#include <string>
#include <string_view>

#include "attnlab/kernel.hpp"
#include "attnlab/problem.hpp"

namespace attnlab {

inline constexpr std::string_view kAutoKernel = "auto";

// The arithmetic a caller allows "auto" to choose: the inputs' own (Native, the default: float32
// products for float32 inputs, bf16 products - P rounded to bf16, as every runtime's bf16 attention -
// for bf16 inputs), float32 products always (F32: "f32"), or int8 products too for float32 inputs
// (Int8: "int8"; flash_int8 and flash_int8_amx's rounded Q and K). An integer cache's decode goes to
// decode_i8 under each: there the cache's rounding dominates the error (auto.cpp's table says by how much).
enum class AutoArithmetic { Native, F32, Int8 };
AutoArithmetic parse_auto_arithmetic(
    const std::string& text);  // "native" | "f32" | "int8"; InvalidInput names the field

struct AutoChoice {
  const Kernel* kernel = nullptr;  // the variant that runs (registry()'s: the default target)
  std::string rule;                // the table row that chose it
  std::string passed_over;         // the row's earlier candidates that cannot run here, with the reasons
  std::string describe() const;    // "decode_i8[avx512] (decode on an integer cache ...; passed over: ...)"
};

// The kernel "auto" runs for the (valid) problem with `threads` threads (its pass: the forward, or a
// backward that needs run_backward). Throws InvalidInput when no kernel can run it, with each reason.
AutoChoice choose_kernel(const Problem& p, int threads, AutoArithmetic arithmetic = AutoArithmetic::Native);

// The named kernel (kernel_or_throw(name, isa)), or for "auto" (isa must be empty) choose_kernel's.
AutoChoice resolve_kernel(std::string_view name, std::string_view isa, const Problem& p, int threads,
                          AutoArithmetic arithmetic = AutoArithmetic::Native);

// The table, one line per row: its regime, the candidates in order, the committed runs it rests on.
std::string auto_table();

}  // namespace attnlab
