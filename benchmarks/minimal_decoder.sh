#!/usr/bin/env bash
# End-to-end decode speed of examples/minimal_decoder on the llama3-8b shape (random bf16 weights,
# synthetic prefill), the issue-8 table: context 32K and 128K x batch 1 and 4 x dense, LycheeDecode
# (layer 0 + 24 learned-like retrieval KV heads, token mode, budget 4096) and ClusterAttn (Cp 1024).
#
#   benchmarks/minimal_decoder.sh [DECODER] [NEW_TOKENS] [LAYOUTS] [TP]
#
# LAYOUTS: the KV layouts to run, "contiguous" (default), "paged" (16-token pages) or "contiguous paged".
# TP: run every cell with --tp TP (GPUs 0 .. TP-1, each generating its shard of the random weights;
# TP=1 is one rank through the tensor-parallel path); the `tp` column says which ("-": no --tp, the
# unsharded decoder, the default) and an `allred` column gives rank 0's all-reduce share of the step
# (from the timed run, like `attn`; "-" with one rank, which has none). The roofline of N ranks is
# the bytes of all of them over N times the bandwidth. CONTEXTS (environment): the contexts to run,
# "32768 131072" by default (CONTEXTS=131072 for the 128K rows only); BATCHES: the batch sizes, "1 4"
# by default ("1 4 8" adds batch 8); KV_DTYPES: the KV cache types, "native" (bf16 on the GPU) by
# default, "native fp8" adds the fp8 (E4M3, per-token scales) rows. A cell whose decoder fails (a
# cache that does not fit the GPU: batch 8 at 128K in bf16 needs ~150 GB) prints its first error line
# and the table goes on.
# DECODER defaults to build/bench/examples/minimal_decoder/minimal_decoder (the `bench` preset).
# Each cell runs twice: with --no-attention-timing (decode steps replayed from a CUDA graph: the
# speed, median step, and the roofline ratio the decoder prints), and with the attention timing on
# (a synchronisation around every attention call: the attention share of the step, slower).
# The roofline's bandwidth is the decoder's default: the GPU's streaming-read ceiling (4.45 TB/s measured
# on the H200, 3.08 on the H100 80GB HBM3; --roofline-tbps in the decoder's help).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
decoder=${1:-$here/build/bench/examples/minimal_decoder/minimal_decoder}
new_tokens=${2:-32}
layouts=${3:-contiguous}
tp=${4:-}
[[ -z $tp || $tp =~ ^[1-9][0-9]*$ ]] || { echo "minimal_decoder.sh: TP must be a positive integer, not '$tp'" >&2; exit 1; }
tp_args=(); [[ -n $tp ]] && tp_args=(--tp "$tp")
contexts=${CONTEXTS:-32768 131072}
batches=${BATCHES:-1 4}
kv_dtypes=${KV_DTYPES:-native}
[[ -x $decoder ]] || { echo "minimal_decoder.sh: no decoder at $decoder (build the bench preset)" >&2; exit 1; }
source "$here/benchmarks/minimal_decoder_policies.sh"  # policy_args

header=(layout kv tp context batch policy "tok/s" "ms/step" "floor ms" roofline "GB/step" attn)
format='%-11s %-6s %-3s %-8s %-5s %-12s %10s %10s %10s %9s %10s %8s'
[[ -n $tp ]] && { header+=(allred); format+=' %8s'; }
printf "$format\n" "${header[@]}"
for layout in $layouts; do
for kv in $kv_dtypes; do
for context in $contexts; do
  prompt=$((context - new_tokens))
  for batch in $batches; do
    lengths=$(printf "$prompt%.0s," $(seq "$batch")); lengths=${lengths%,}
    for policy in dense lycheedecode clusterattn; do
      common=(--random llama3-8b --random-prompts "$lengths" --synthetic-prefill --new-tokens "$new_tokens" --quiet
              --device gpu --kv-layout "$layout" --kv-dtype "$kv" ${tp_args[@]+"${tp_args[@]}"} $(policy_args "$policy"))
      if ! fast=$("$decoder" "${common[@]}" --no-attention-timing 2>&1); then
        printf '%-11s %-6s %-3s %-8s %-5s %-12s %s\n' "$layout" "$kv" "${tp:--}" "$context" "$batch" "$policy" \
          "failed: $(grep -m1 -i -E 'error|out of memory' <<<"$fast" || tail -n1 <<<"$fast")"
        continue
      fi
      timed=$("$decoder" "${common[@]}" 2>&1) || timed=
      tps=$(sed -n 's/^decode: .*: \([0-9.]*\) tokens\/s.*/\1/p' <<<"$fast")
      roof=$(grep '^roofline:' <<<"$fast")
      gb=$(sed -n 's/^roofline: \([0-9.]*\) GB.*/\1/p' <<<"$roof")
      floor=$(sed -n 's/.* = \([0-9.]*\) ms; median.*/\1/p' <<<"$roof")
      step=$(sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p' <<<"$roof")
      ratio=$(sed -n 's/.* = \([0-9.]*%\) of the roofline/\1/p' <<<"$roof")
      attn=$(sed -n 's/.*(attention \([0-9]*%\)).*/\1/p' <<<"$timed")
      row=("$layout" "$kv" "${tp:--}" "$context" "$batch" "$policy" "$tps" "$step" "$floor" "$ratio" "$gb" "$attn")
      if [[ -n $tp ]]; then
        allred=$(sed -n 's/.*(all-reduce \([0-9]*%\)).*/\1/p' <<<"$timed")
        row+=("${allred:--}")
      fi
      printf "$format\n" "${row[@]}"
    done
  done
done
done
done
