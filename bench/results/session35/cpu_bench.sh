#!/bin/bash
# $1 binary, $2 mode, $3 out dir: 8 steps of the demo's LoRA run; prints the mean tok/s of steps 3-8
bin=$1; mode=$2; out=$3
rm -rf $out
$bin train --model build/demo/smollm2 --data examples/demo/loom_persona.jsonl --out $out --lora-alpha 32 --seq-len 256 \
  --batch-size 4 --lr 0.002 --max-steps 8 --log-every 1 --checkpointing $mode --seed 1 2>&1 | \
  awk -v m=$mode -v b=$(basename $(dirname $(dirname $(dirname $bin)))) '/^step [0-9]/{split($0,a,"|"); n=split(a[1],s," "); split(s[2],st,"/"); if (st[1]>2) {gsub(/ tok\/s/,"",a[5]); t+=a[5]; c++; l=a[2]}} END{printf "%-12s %-10s mean %.1f tok/s over %d steps, last %s\n", b, m, t/c, c, l}'
