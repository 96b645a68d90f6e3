#!/bin/bash
# decode per cache type: per-key time with the cache in L3 (4096 keys; f32 2048) against 32k keys in DRAM, alternated
cd "$(dirname "$0")/../.."
for round in 1 2; do
for kv in f32 bf16 f16 fp8_e5m2 u8 q8_0 u4 q4_0; do
 if [ $kv = f32 ] || [ $kv = bf16 ] || [ $kv = f16 ]; then env="AB_DTYPE=$kv"; else env="AB_KV_DTYPE=$kv"; fi
 small=$([ $kv = f32 ] && echo 2048 || echo 4096)
 for n in $small 32768; do pairs=$([ $n = 32768 ] && echo 6 || echo 16)
  r=$(env $env build/attn_ab_switch decode $n bhsd $pairs 2 2>&1 | tail -1 | sed 's/.*before *\([0-9.]*\) ms, after *\([0-9.]*\) ms.*/\1 \2/')
  echo "$round $kv $n $r"
 done
done; done
