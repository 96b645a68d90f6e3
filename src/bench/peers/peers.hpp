// Peers: what users run instead of the lab's kernels, measured in the same sweep on the same
// inputs and verified the same way (`attnlab sweep --peers torch,ort,jax`, or an experiment's
// "peers" key). A peer point is a grid point whose kernel is a peer name:
//
//   torch_sdpa  torch.nn.functional.scaled_dot_product_attention   family torch
//   torch_flex  FlexAttention (sparse patterns and windows)         family torch
//   ort_mha     ONNX Runtime com.microsoft.MultiHeadAttention       family ort
//   ort_gqa     ONNX Runtime com.microsoft.GroupQueryAttention      family ort
//   ov_sdpa     OpenVINO's CPU plugin, opset13 ScaledDotProductAttention family ov
//   ov_decode   OpenVINO's stateful decode (its generation path: the KV    family ov
//               cache the model's state, f32, f16 or u8)
//   jax_dpa     jax.nn.dot_product_attention                         family jax
//   ggml_fa     ggml_flash_attn_ext (llama.cpp's CPU attention)      family ggml
//               (also on f16 and q8_0 / q4_0 caches: ggml's own cache types)
//
// The peers run in Python (scripts/peers/serve.py, one process per family and thread count,
// kept for the sweep, in the virtual environment scripts/lab peers-setup makes: .venv-peers, or
// $ATTN_PEERS_PYTHON). Per point the sweep writes the point's random inputs as float32 .npy
// files, the peer server times its call (warm-up, then repetitions x min_time like Google
// Benchmark) and writes O (and, for a backward point, dQ, dK, dV from the dO it was handed);
// the sweep checks O against the float64 reference with the float32 tolerance policy (and the
// gradients on sampled rows and keys, verify.hpp check_backward_sampled's rule) (a peer that disagrees is recorded as
// failed, not timed) and writes the row (isa "peer", the peer's version and how it was driven in `version` / `how`). A
// peer that cannot run a point as specified says why and the point is skipped with that reason.
#pragma once

#include <sys/types.h>

#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/npy.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"

namespace attnlab::bench {

// The isa column of a peer row (its % of peak is against the default target's FMA peak).
inline constexpr const char* kPeerIsa = "peer";

// Every peer kernel name, in report order, and the family (Python module) that runs it.
const std::vector<std::pair<std::string, std::string>>& peer_kernels();
// The tolerance policy a peer's catalogue row names (scripts/peers/catalogue.json "tolerance"):
// which points it runs beyond float32 ones (on a cache or precision of its own) and what its
// arithmetic adds to the point's policy (peer_tolerance.cpp).
enum class PeerPolicy {
  Float32,             // float32 points only, the point's float32 policy
  Bf16Products,        // ov_sdpa, zentorch_sdpa: bf16 points too, in their own bf16 arithmetic (flash_bf16's policy)
  OpenvinoStateCache,  // ov_decode: f16 points and u8/u4 caches in its own state cache (float32 policy)
  OpenvinoSage,        // ov_sage: Q, K to int8 per token, V to u8, P.V in bf16 (float32 points)
  GgmlCache,           // ggml_fa: f16 points and q8_0/q4_0 caches in ggml's own types
  OrtIntCache,         // ort_gqa: u8/q8_0 (u4/q4_0) caches in its own int8 (int4) cache, a scale per channel
};
// The policy of a catalogue name ("float32", "bf16_products", ...); throws naming the allowed ones.
PeerPolicy parse_peer_policy(const std::string& name);
// The policy of a peer kernel (Float32 for a name that is not a peer's).
PeerPolicy peer_policy(const std::string& kernel);
bool is_peer_kernel(const std::string& name);
// "torch, ort, ov, jax, ggml (families: all of their kernels) or torch_sdpa, ...": what --peers takes.
std::string allowed_peers();
// Families ("torch", "ort", "jax") or kernel names -> peer kernel names (report order,
// deduplicated). `what` names the field in errors; throws InvalidInput listing the allowed names.
std::vector<std::string> parse_peers(const std::vector<std::string>& items, const std::string& what);
// "torch,ort" -> {"torch", "ort"} (empty items dropped).
std::vector<std::string> split_list(const std::string& text);

// Memory a peer point needs: the lab's inputs, their float32 copies in the files and in the
// peer, O, a dense mask (the largest a peer builds: float32 B x Sq x Skv), and for the peers
// that materialize the scores (measured: jax_dpa, ort_mha under a mask) twice the float32
// score matrix.
size_t peer_memory_bytes(const std::string& kernel, const Problem& p);
// The family of a peer kernel ("torch" for torch_sdpa), "" for a name that is not a peer's.
std::string peer_family(const std::string& kernel);

// The values a point's inputs store, as float32 inputs of the same shapes (what a peer is handed
// for a 16-bit or quantized point: 16-bit values widened exactly, a quantized cache read by its rule).
struct StoredAsFloat {
  Problem problem;
  Tensors tensors;
};
StoredAsFloat stored_as_float(const Problem& p, const Inputs& in);
// Whether a peer keeps a point's 16-bit or quantized cache in a cache of its own that holds the
// lab's values (ggml_fa on ggml's cache types, ov_decode on f16/u8, ov_sdpa's bf16 precision).
bool peer_keeps_own_cache(const std::string& kernel, const Problem& p);

// The tolerance a peer's O is judged with: the point's float32 policy (Agreement::tol), widened
// for ggml_fa on its own cache types by what its arithmetic implies - Q rounded to q8_0 for the
// dot products with a q8_0/q4_0 K (the float64 attention with Q so rounded, its distance from the
// reference, times Tolerance::kFactor), P.V accumulated in f16 for an F16 V (2^-9) - and the
// rule in words ("" for the plain policy).
struct PeerTolerance {
  Tolerance tol;
  std::string rule;
};
inline constexpr double kGgmlF16Accumulation = 1.0 / 512;
PeerTolerance peer_tolerance(const std::string& kernel, const Problem& p, const Inputs& in, const Agreement& ag);

// What a peer server answered for one point.
struct PeerAnswer {
  enum class Status { Ok, Skipped, Failed } status = Status::Failed;
  std::string reason, version, how;
  std::vector<double> times;  // seconds per call, one per repetition
  int64_t iterations = 0;
  int64_t extra_bytes = -1;  // the peer's measured peak RSS growth over its inputs (-1: unknown)
  NpyArray o;                // float32 (B, Hq, Sq, Dv) (status Ok)
  // A backward point (Problem::pass): the gradients, float32 (B, H, S, D) as Q, K, V.
  NpyArray dq, dk, dv;
};

struct PeerTiming {
  int repetitions = 3;
  double min_time_s = 0.05;
  double time_cap_s = 60;
};

// The peer servers of one sweep and the scratch folder the inputs go through.
class PeerPool {
 public:
  // `python`: the interpreter ("" = peers_python()); `serve_script`: scripts/peers/serve.py
  // ("" = the source tree's).
  explicit PeerPool(std::ostream& log, std::string python = "", std::string serve_script = "");
  ~PeerPool();
  PeerPool(const PeerPool&) = delete;
  PeerPool& operator=(const PeerPool&) = delete;

  // Runs `kernel` on the problem's inputs (`in`: float32, the problem's layout) with `threads`.
  // Never throws for the peer's own trouble (missing environment, a crash, no answer within
  // the time it may take): those come back as Skipped or Failed with the reason.
  // A problem whose pass is not the forward also hands over dO (O's shape, the problem's
  // layout): the peer differentiates its own forward (torch autograd, jax.vjp) and times the
  // backward alone (forward_backward: both) and returns O and the gradients.
  PeerAnswer run(const std::string& kernel, const Problem& p, const Inputs& in, int threads, const PeerTiming& t,
                 const float* d_o = nullptr);

  static std::string default_python();  // $ATTN_PEERS_PYTHON, else <source>/.venv-peers/bin/python
  // The Python a family runs in: its own venv's (catalogue.json "venv"), else the pool's.
  std::string python_for(const std::string& family) const;

 private:
  struct Server {
    pid_t pid = -1;
    int to = -1, from = -1;
    std::string buffer;       // read but not yet consumed
    std::string unavailable;  // why this family cannot run here ("" = it can)
    std::string version;
  };
  Server& server(const std::string& family, int threads);
  bool start(Server& s, const std::string& family, int threads);
  bool send(Server& s, const nlohmann::json& request);
  // One answer line; null on timeout, EOF (then *eof = true) or an unparsable line.
  nlohmann::json receive(Server& s, double timeout_s, bool* eof = nullptr);
  void stop(Server& s);
  const std::string& scratch();

  std::ostream& log_;
  std::string python_, serve_;
  std::string scratch_;
  std::map<std::pair<std::string, int>, Server> servers_;
};

}  // namespace attnlab::bench
