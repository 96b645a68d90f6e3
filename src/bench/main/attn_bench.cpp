// attn_bench: placeholder until the Google Benchmark registration lands (next commit).
#include <cstdio>
int main() {
  std::fputs("attn_bench: not built yet; use attnlab peak\n", stderr);
  return 2;
}
