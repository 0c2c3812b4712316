#!/usr/bin/env bash
# Runs GPU tests on the CPU emulation of the ops (tests/python/kernel_emulation.py), for a machine
# without a GPU: a copy of tests/python in tests/on_cpu/ with "cuda" read as "cpu", the Hopper
# skip off and every sonicmoe op emulated. It checks a GPU test's own code (its inputs, its
# reference, its asserts) before the device runs it; it says nothing of a kernel. Each emulated
# op runs the real op's argument checks first, so the ops' rejection tests pass in the copy but
# for their "must be a CUDA device" cases. Run the tests you mean (-k): the copy fails where a
# test is about CPU tensors (those device cases; the reference on CPU tensors) or calls
# torch.cuda, and the suite's largest shapes are slow on the emulation. Pass pytest's arguments:
#
#   bash scripts/gpu_tests_on_cpu.sh test_routing_kernel.py -k router_backward_rows_matches
set -euo pipefail
cd "$(dirname "$0")/.."
dst=tests/on_cpu  # the same depth as tests/python: conftest finds python/ and benchmarks/ from it
rm -rf "$dst"
mkdir -p "$dst"
for f in tests/python/*.py; do
  sed -e 's/"cuda"/"cpu"/g; s/\.cuda()/.cpu()/g' "$f" > "$dst/$(basename "$f")"
done
sed -i 's/^HOPPER_SKIP_REASON = _hopper_reason()$/HOPPER_SKIP_REASON = None  # gpu_tests_on_cpu.sh/' "$dst/conftest.py"
grep -q "^HOPPER_SKIP_REASON = None" "$dst/conftest.py" || { echo "conftest.py: HOPPER_SKIP_REASON line not found"; exit 1; }
cat >> "$dst/conftest.py" <<'EOF'


@pytest.fixture(autouse=True)
def _every_op_emulated():  # gpu_tests_on_cpu.sh
    from kernel_emulation import emulated_kernels
    with emulated_kernels():
        yield
EOF
cd "$dst"
exec python3 -m pytest -p no:cacheprovider "$@"
