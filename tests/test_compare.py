"""harness.compare on its own (no processes): integer outputs compared exactly, the tolerance and
non-finite rules on small tensors. The verifier suite covers the same contract end to end."""
import torch

from harness.compare import Tolerance, compare_output, structure_error


def test_integer_outputs_must_be_equal():
    """argmax-style outputs: one index off fails (no tolerance applies to integers)."""
    ref = torch.tensor([3, 0, 7, 1])
    assert compare_output(0, ref, ref.clone(), Tolerance()).ok
    off = ref.clone()
    off[2] = 6
    chk = compare_output(0, ref, off, Tolerance())
    assert not chk.ok and chk.max_abs == 1.0 and "integer values differ" in chk.reason


def test_float_tolerance_and_non_finite_values():
    ref = torch.tensor([1.0, -2.0, 1000.0])
    tol = Tolerance()
    assert compare_output(0, ref, ref + 5e-5, tol).ok  # inside atol + rtol * |ref|
    chk = compare_output(0, ref, ref + torch.tensor([0.0, 0.0, 0.2]), tol)
    assert not chk.ok and chk.max_abs > 0.1  # 0.2 > 1e-4 + 1e-4 * 1000
    nan = ref.clone()
    nan[0] = float("nan")
    assert not compare_output(0, ref, nan, tol).ok
    assert "NaN/Inf" in compare_output(0, ref, nan, tol).reason


def test_structure_shape_and_dtype():
    ref = [torch.zeros(2, 3)]
    assert structure_error(ref, [torch.zeros(2, 3)]) is None
    assert "shape" in structure_error(ref, [torch.zeros(3, 2)])
    assert "dtype" in structure_error(ref, [torch.zeros(2, 3, dtype=torch.float64)])
