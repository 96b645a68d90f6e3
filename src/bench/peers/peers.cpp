#include "bench/peers/peers.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <sstream>

#include "attnlab/kv_quant.hpp"
#include "bench/results/files.hpp"
#include "bench/results/results.hpp"

#ifndef ATTN_SOURCE_DIR
#define ATTN_SOURCE_DIR "."
#endif

namespace attnlab::bench {

namespace {
using Json = nlohmann::json;

// How long a server may take to import its library and answer hello (torch: seconds).
constexpr double kHelloTimeout = 180;
// Beyond the time cap: a first call's compilation (jit, torch.compile) and file transfers.
constexpr double kRunSlack = 180;

// The peers' families, in the catalogue's order of their first peer.
std::vector<std::string> families() {
  std::vector<std::string> f;
  for (const auto& [k, family] : peer_kernels())
    if (std::find(f.begin(), f.end(), family) == f.end()) f.push_back(family);
  return f;
}

// The inputs as the .npy files a peer reads: float32 in the problem's layout.
void write_inputs(const std::string& dir, const Problem& p, const Inputs& in) {
  const auto shape = [&](int64_t heads, int64_t seq, int64_t dim) {
    return p.layout == Layout::BHSD ? std::vector<int64_t>{p.batch, heads, seq, dim}
                                    : std::vector<int64_t>{p.batch, seq, heads, dim};
  };
  write_npy(dir + "/q.npy", in.q.data, shape(p.q_heads, p.q_len, p.head_dim));
  write_npy(dir + "/k.npy", in.k.data, shape(p.kv_heads, p.kv_len, p.head_dim));
  write_npy(dir + "/v.npy", in.v.data, shape(p.kv_heads, p.kv_len, p.dim_v()));
}

PeerAnswer answer(PeerAnswer::Status s, std::string reason) {
  PeerAnswer a;
  a.status = s;
  a.reason = std::move(reason);
  return a;
}
}  // namespace

std::string peer_family(const std::string& kernel) {
  for (const auto& [k, f] : peer_kernels()) {
    if (k == kernel) return f;
  }
  return "";
}

namespace {
// The peers' catalogue (scripts/peers/catalogue.json), as CMake writes it at configure time.
struct CatalogueRow {
  const char* name;
  const char* family;
  const char* tolerance;
  const char* venv;  // the family's own venv, relative to the source tree ("": the pool's Python)
};
constexpr CatalogueRow kCatalogue[] = {
#include "peer_catalogue.inc"
};
}  // namespace

const std::vector<std::pair<std::string, std::string>>& peer_kernels() {
  static const std::vector<std::pair<std::string, std::string>> k = [] {
    std::vector<std::pair<std::string, std::string>> r;
    for (const CatalogueRow& row : kCatalogue) r.emplace_back(row.name, row.family);
    return r;
  }();
  return k;
}

PeerPolicy parse_peer_policy(const std::string& name) {
  static const std::pair<const char*, PeerPolicy> kNames[] = {
      {"float32", PeerPolicy::Float32},
      {"bf16_products", PeerPolicy::Bf16Products},
      {"openvino_state_cache", PeerPolicy::OpenvinoStateCache},
      {"openvino_sage", PeerPolicy::OpenvinoSage},
      {"ggml_cache", PeerPolicy::GgmlCache},
      {"ort_int_cache", PeerPolicy::OrtIntCache},
  };
  std::string allowed;
  for (const auto& [n, policy] : kNames) {
    if (name == n) return policy;
    allowed += (allowed.empty() ? "" : ", ") + std::string(n);
  }
  throw std::invalid_argument("tolerance: '" + name + "' is not a peer tolerance policy (allowed: " + allowed + ")");
}

PeerPolicy peer_policy(const std::string& kernel) {
  for (const CatalogueRow& row : kCatalogue) {
    if (kernel == row.name) {
      try {
        return parse_peer_policy(row.tolerance);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("scripts/peers/catalogue.json, peer " + kernel + ": " + e.what());
      }
    }
  }
  return PeerPolicy::Float32;
}

bool is_peer_kernel(const std::string& name) { return !peer_family(name).empty(); }

std::string allowed_peers() {
  std::string a;
  for (const auto& f : families()) a += (a.empty() ? "" : ", ") + f;
  a += " (families: all of their kernels) or";
  bool first = true;
  for (const auto& [k, f] : peer_kernels()) a += (first ? " " : ", ") + k, first = false;
  return a;
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<std::string> parse_peers(const std::vector<std::string>& items, const std::string& what) {
  std::vector<bool> on(peer_kernels().size(), false);
  for (const std::string& item : items) {
    bool known = false;
    for (size_t i = 0; i < peer_kernels().size(); ++i) {
      if (peer_kernels()[i].first == item || peer_kernels()[i].second == item) on[i] = known = true;
    }
    if (!known) throw InvalidInput(what + ": '" + item + "' is not a peer; allowed: " + allowed_peers());
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < on.size(); ++i) {
    if (on[i]) out.push_back(peer_kernels()[i].first);
  }
  return out;
}

size_t peer_memory_bytes(const std::string& kernel, const Problem& p) {
  const auto f32 = [](int64_t elems) { return static_cast<size_t>(elems) * sizeof(float); };
  // JAX's XLA attention materializes the scores, and so does ONNX Runtime's MultiHeadAttention
  // under a mask (unidirectional or the bias; without one it runs flash-style): their measured
  // peak RSS growth (results.csv extra_bytes of results/2026-12-01-masks, 8 heads x 2048^2,
  // a 128 MiB float32 score matrix) was 256-362 MiB, ~2x it, and ort_mha's without a mask 0;
  // torch's SDPA 20 MiB at 8 x 4096^2 (2026-12-01-quick), ort_gqa < 1 MiB (decode).
  const bool masked = p.visible_pairs() < p.batch * p.q_heads * p.q_len * p.kv_len;
  const bool materializes = kernel == "jax_dpa" || (kernel == "ort_mha" && masked);
  const size_t scores = materializes ? 2 * f32(p.batch * p.q_heads * p.q_len * p.kv_len) : 0;
  const size_t inputs = f32(p.q_elems() + p.kv_elems() + p.v_elems());
  const size_t mask = f32(p.batch * p.q_len * p.kv_len);
  // K/V repeated to every query head (ort_mha's GQA)
  const size_t repeated = p.group() > 1 ? f32(p.batch * p.q_heads * p.kv_len * (p.head_dim + p.dim_v())) : 0;
  // ov_decode's state: the cache in the plugin's own buffers - measured peak RSS growth 3.0x the
  // float32 K/V at 32/8 heads, d 128, kv 32768 (f32 cache; f16 2.0x, u8 1.65x)
  const size_t state = kernel == "ov_decode" ? 3 * f32(p.kv_elems() + p.v_elems()) : 0;
  // a 16-bit or quantized point's float32 source values (the row's error against them)
  const size_t unrounded = p.dtype != DType::F32 || p.kv_quantized() ? inputs : 0;
  // A backward point: dO (the lab's, the file's, the peer's), the gradients three times (the
  // peer's, the files read back, the check's), the autograd graph's saved scores when the peer
  // materializes them, and the check's forward (O, LSE).
  const size_t grads = f32(p.q_elems() + p.kv_elems() + p.v_elems());
  const size_t backward =
      p.pass == Pass::Forward ? 0 : 3 * f32(p.o_elems()) + 3 * grads + scores + f32(p.o_elems() + p.lse_elems());
  // the lab's tensors, the files, the peer's arrays, O twice (the peer's and the one read back)
  return static_cast<size_t>(tensor_bytes(p)) + 2 * inputs + unrounded + repeated + state + 2 * f32(p.o_elems()) +
         mask + scores + backward;
}

std::string PeerPool::python_for(const std::string& family) const {
  for (const CatalogueRow& row : kCatalogue) {
    if (family == row.family && row.venv[0] != '\0')
      return std::string(ATTN_SOURCE_DIR) + "/" + row.venv + "/bin/python";
  }
  return python_;
}

std::string PeerPool::default_python() {
  if (const char* env = std::getenv("ATTN_PEERS_PYTHON"); env && *env) return env;
  return std::string(ATTN_SOURCE_DIR) + "/.venv-peers/bin/python";
}

PeerPool::PeerPool(std::ostream& log, std::string python, std::string serve_script)
    : log_(log),
      python_(python.empty() ? default_python() : std::move(python)),
      serve_(serve_script.empty() ? std::string(ATTN_SOURCE_DIR) + "/scripts/peers/serve.py"
                                  : std::move(serve_script)) {
  // A server that dies makes our next write fail with EPIPE, not kill the sweep.
  ::signal(SIGPIPE, SIG_IGN);
}

PeerPool::~PeerPool() {
  for (auto& [key, s] : servers_) stop(s);
  if (!scratch_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(scratch_, ec);
  }
}

const std::string& PeerPool::scratch() {
  if (scratch_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/attnlab-peers-XXXXXX";
    if (!::mkdtemp(pattern.data()))
      throw IoError(pattern + ": creating the peers' scratch folder failed: " + std::strerror(errno));
    scratch_ = pattern;
  }
  return scratch_;
}

bool PeerPool::start(Server& s, const std::string& family, int threads) {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0) return false;
  if (::pipe2(from, O_CLOEXEC) != 0) {
    ::close(to[0]), ::close(to[1]);
    return false;
  }
  const std::string t = std::to_string(threads), python = python_for(family);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to[0], 0);
    ::dup2(from[1], 1);
    const char* argv[] = {python.c_str(), "-u",        serve_.c_str(), "--family",
                          family.c_str(), "--threads", t.c_str(),      nullptr};
    ::execv(python.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(to[0]);
  ::close(from[1]);
  if (pid < 0) {
    ::close(to[1]), ::close(from[0]);
    return false;
  }
  s.pid = pid;
  s.to = to[1];
  s.from = from[0];
  return true;
}

void PeerPool::stop(Server& s) {
  if (s.to >= 0) ::close(s.to);  // EOF on stdin: the server's loop ends
  if (s.pid > 0) {
    int status = 0;
    for (int i = 0; i < 50 && ::waitpid(s.pid, &status, WNOHANG) == 0; ++i) ::usleep(100000);
    if (::waitpid(s.pid, &status, WNOHANG) == 0) {
      ::kill(s.pid, SIGKILL);
      ::waitpid(s.pid, &status, 0);
    }
  }
  if (s.from >= 0) ::close(s.from);
  s.pid = s.to = s.from = -1;
  s.buffer.clear();
}

bool PeerPool::send(Server& s, const Json& request) {
  const std::string line = request.dump() + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(s.to, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

Json PeerPool::receive(Server& s, double timeout_s, bool* eof) {
  if (eof) *eof = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    if (const size_t nl = s.buffer.find('\n'); nl != std::string::npos) {
      const std::string line = s.buffer.substr(0, nl);
      s.buffer.erase(0, nl + 1);
      try {
        return Json::parse(line);
      } catch (const Json::exception&) {
        log_ << "\n  (peer server sent an unparsable line: " << line.substr(0, 200) << ")";
        return Json();
      }
    }
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return Json();
    pollfd pfd{s.from, POLLIN, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(std::min(left * 1000, 60000.0)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;  // re-check the deadline
    char buf[4096];
    const ssize_t n = ::read(s.from, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // EOF: the server died (it may not be reapable yet)
      if (eof) *eof = true;
      return Json();
    }
    s.buffer.append(buf, static_cast<size_t>(n));
  }
}

PeerPool::Server& PeerPool::server(const std::string& family, int threads) {
  Server& s = servers_[{family, threads}];
  if (s.pid > 0 || !s.unavailable.empty()) return s;
  const std::string python = python_for(family);
  if (!file_exists(python)) {
    s.unavailable = "no peers environment: " + python + " does not exist (scripts/lab peers-setup" +
                    (python == python_ ? " makes it; or set ATTN_PEERS_PYTHON)" : " " + family + " makes it)");
  } else if (!file_exists(serve_)) {
    s.unavailable = "the peer server " + serve_ + " does not exist";
  } else if (!start(s, family, threads)) {
    s.unavailable = "starting " + python + " failed: " + std::strerror(errno);
  } else {
    const Json hello = send(s, {{"cmd", "hello"}}) ? receive(s, kHelloTimeout) : Json();
    if (hello.is_null()) {
      s.unavailable = family + " peer server (" + python + ") did not answer hello within " +
                      std::to_string(static_cast<int>(kHelloTimeout)) + " s";
    } else if (hello.value("status", "") != "ok") {
      s.unavailable = hello.value("reason", std::string("unavailable"));
    } else {
      s.version = hello.value("version", "");
      log_ << "\n  (peers: " << s.version << " at " << threads << " thread" << (threads > 1 ? "s" : "") << ", "
           << python << ")";
    }
    if (!s.unavailable.empty()) stop(s);
  }
  if (!s.unavailable.empty()) log_ << "\n  (peers: " << family << " unavailable: " << s.unavailable << ")";
  return s;
}

PeerAnswer PeerPool::run(const std::string& kernel, const Problem& p, const Inputs& in, int threads,
                         const PeerTiming& t, const float* d_o) {
  using S = PeerAnswer::Status;
  const std::string family = peer_family(kernel);
  if (family.empty()) return answer(S::Failed, kernel + " is not a peer");
  if (p.mask) return answer(S::Skipped, "mask files are not handed to peers (patterns given by their terms are)");
  const bool own = peer_keeps_own_cache(kernel, p);
  // the one place this rule lives (the servers never see such points)
  if ((in.dtype != DType::F32 || !in.q.data) && !own) {
    return answer(S::Skipped, "peers run float32 points (a bf16/f16 peer rounds P and needs its own tolerance)");
  }
  if (p.kv_paged()) {
    return answer(S::Skipped, "kv_block " + std::to_string(p.kv_block) +
                                  ": the peers take contiguous K/V (paged caches are measured against the lab's own "
                                  "contiguous point)");
  }
  if (p.kv_quantized() && !own) {
    return answer(S::Skipped, std::string("kv_dtype ") + to_string(p.kv_dtype) +
                                  ": the peers take float32 K/V (none of them reads this cache layout; ggml_fa reads "
                                  "q8_0 and q4_0, ov_decode u8 and u4, ort_gqa its int8 / int4 cache on u8, q8_0, "
                                  "u4, q4_0)");
  }
  Server& s = server(family, threads);
  if (!s.unavailable.empty()) return answer(S::Skipped, s.unavailable);
  const std::string& dir = scratch();
  // Outputs left from the point before are never read as this one's.
  for (const char* name : {"o", "dq", "dk", "dv"}) std::filesystem::remove(dir + "/" + name + ".npy");
  const bool backward = p.pass != Pass::Forward;
  if (backward && !d_o) return answer(S::Failed, "a backward point without dO");
  if (backward) {
    write_npy(dir + "/do.npy", d_o,
              p.layout == Layout::BHSD ? std::vector<int64_t>{p.batch, p.q_heads, p.q_len, p.dim_v()}
                                       : std::vector<int64_t>{p.batch, p.q_len, p.q_heads, p.dim_v()});
  }
  if (in.dtype == DType::F32 && !p.kv_quantized()) {
    write_inputs(dir, p, in);
  } else {  // the stored values as float32: 16-bit widened exactly, a quantized cache read by its rule
    const StoredAsFloat f = stored_as_float(p, in);
    write_inputs(dir, f.problem, f.tensors.inputs);
  }
  Json problem = problem_to_json(p);
  problem["scale"] = p.effective_scale();
  const Json request = {{"cmd", "run"},
                        {"kernel", kernel},
                        {"dir", dir},
                        {"problem", problem},
                        {"repetitions", t.repetitions},
                        {"min_time_s", t.min_time_s},
                        {"time_cap_s", t.time_cap_s}};
  const double timeout = t.time_cap_s * 2 + kRunSlack;
  bool died = false;
  const Json reply = send(s, request) ? receive(s, timeout, &died) : (died = true, Json());
  if (reply.is_null()) {
    stop(s);  // a later point starts a fresh server
    return died ? answer(S::Failed, "the " + family + " peer server died (out of memory, or a crash: its stderr above)")
                : answer(S::Skipped, "time cap: the peer did not answer within " +
                                         std::to_string(static_cast<int>(timeout)) + " s (its server was stopped)");
  }
  PeerAnswer a;
  a.version = reply.value("version", s.version);
  a.how = reply.value("how", "");
  a.reason = reply.value("reason", "");
  const std::string status = reply.value("status", "");
  if (status == "skipped") {
    a.status = S::Skipped;
    return a;
  }
  if (status != "ok") {
    a.status = S::Failed;
    if (a.reason.empty()) a.reason = "the peer answered " + reply.dump().substr(0, 200);
    return a;
  }
  try {
    a.times = reply.at("times").get<std::vector<double>>();
    a.iterations = reply.at("iterations").get<int64_t>();
    if (reply.contains("extra_bytes") && reply["extra_bytes"].is_number())
      a.extra_bytes = reply["extra_bytes"].get<int64_t>();
    a.o = read_npy(dir + "/o.npy");
    widen_to_float(a.o);
    if (backward) {
      a.dq = read_npy(dir + "/dq.npy"), a.dk = read_npy(dir + "/dk.npy"), a.dv = read_npy(dir + "/dv.npy");
      for (NpyArray* g : {&a.dq, &a.dk, &a.dv}) widen_to_float(*g);
    }
  } catch (const std::exception& e) {
    return answer(S::Failed, std::string("the peer's answer is incomplete: ") + e.what());
  }
  const std::vector<int64_t> want = {p.batch, p.q_heads, p.q_len, p.dim_v()};
  if (a.o.shape != want || a.times.empty()) {
    return answer(S::Failed, "the peer's O has the wrong shape or no times (want (B, Hq, Sq, Dv))");
  }
  if (backward && (a.dq.shape != std::vector<int64_t>{p.batch, p.q_heads, p.q_len, p.head_dim} ||
                   a.dk.shape != std::vector<int64_t>{p.batch, p.kv_heads, p.kv_len, p.head_dim} ||
                   a.dv.shape != std::vector<int64_t>{p.batch, p.kv_heads, p.kv_len, p.dim_v()})) {
    return answer(S::Failed, "the peer's dQ, dK or dV has the wrong shape (want (B, H, S, D) as Q, K, V)");
  }
  a.status = S::Ok;
  return a;
}

}  // namespace attnlab::bench
