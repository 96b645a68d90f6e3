#!/bin/bash
# Alternate before/after sweeps of the regression grids: 3 rounds.
cd /tmp/reg
for round in 1 2 3; do
  for e in seq hd gqa; do
    for v in before after; do
      /tmp/ab/$v sweep --experiment $e.json --out /tmp/reg/${e}_${v}_$round > /tmp/reg/${e}_${v}_$round.log 2>&1
    done
  done
done
echo ALLDONE
