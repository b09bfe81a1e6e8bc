# shellcheck shell=bash
# The minimal decoder's benchmark policies, sourced by benchmarks/minimal_decoder.sh (issue 8's table)
# and scripts/decoder-ab.sh (a change's before and after), so both time the same three:
#   dense
#   lycheedecode  layer 0 + 24 learned-like retrieval KV heads, token mode, budget 4096 (sink 128, recent 256)
#   clusterattn   Cp 1024, window 32, theta 0.002, 128 blocks
# policy_args POLICY [ROOT]: the decoder's arguments for POLICY, the roles file under ROOT (the tree the
# decoder was built from; default this checkout).
policy_args() {
  local root=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
  case $1 in
    dense) echo "--policy dense" ;;
    lycheedecode) echo "--policy lycheedecode --lycheedecode-mode token --lycheedecode-budget 4096 --lycheedecode-sink 128 --lycheedecode-recent 256 --roles $root/examples/minimal_decoder/roles/llama3-8b-learned-like.roles" ;;
    clusterattn) echo "--policy clusterattn --cp 1024 --window 32 --theta 0.002 --num-block 128" ;;
    *) echo "policy_args: unknown policy '$1' (dense, lycheedecode, clusterattn)" >&2; return 1 ;;
  esac
}
