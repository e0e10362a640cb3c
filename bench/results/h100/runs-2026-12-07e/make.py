"""Copies of the ws kernel whose Q K^T takes part of Q from registers (issue 38, the fewer-shared-memory-bytes
family). Written to this folder; compiled offline by compile.sh, two timed by exp_ws_floor --extra."""
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT / "bench" / "experiments"), str(ROOT / "bench")]
import exp_ws_floor as floor  # noqa: E402

KERNEL = floor.KERNEL.read_text()
QK = re.compile(r"^(?P<i>[ \t]+)s = _wgmma\(q_first, kv_first\.permute\(\(1, 0\)\), s_zero, use_acc=False,\s*"
                r"is_async=True\)\n(?P<between>(?:[ \t]+(?:mbarrier\.wait|_fence_async_shared)\([^\n]*\n){2})"
                r"[ \t]+s = _wgmma\(q_second, kv_second\.permute\(\(1, 0\)\), s, is_async=True\)\n", re.M)
DOT = "gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)"
# name: the first half's Q K^T (first/second: the tile halves, before/after the wait for the second)
FORMS = {
    # two k64 chunks from one register tile (Q's columns 0-63), the rest of the first half from shared memory
    "q2": (f"q_reg = q_first.slice(0, 64, dim=1).load({DOT})\n"
           "s = _wgmma(q_reg, kv_first.slice(0, 64, dim=1).permute((1, 0)), s_zero, use_acc=False, is_async=True)\n"
           "s = _wgmma(q_reg, kv_first.slice(64, 64, dim=1).permute((1, 0)), s, is_async=True)\n"
           "s = _wgmma(q_first.slice(128, 128, dim=1), kv_first.slice(128, 128, dim=1).permute((1, 0)), s, is_async=True)\n",
           "s = _wgmma(q_second, kv_second.permute((1, 0)), s, is_async=True)\n"),
    # two k64 chunks from two register tiles (Q's columns 0-63 and 64-127)
    "q2d": (f"q_reg = q_first.slice(0, 64, dim=1).load({DOT})\n"
            "s = _wgmma(q_reg, kv_first.slice(0, 64, dim=1).permute((1, 0)), s_zero, use_acc=False, is_async=True)\n"
            f"q_reg1 = q_first.slice(64, 64, dim=1).load({DOT})\n"
            "s = _wgmma(q_reg1, kv_first.slice(64, 64, dim=1).permute((1, 0)), s, is_async=True)\n"
            "s = _wgmma(q_first.slice(128, 128, dim=1), kv_first.slice(128, 128, dim=1).permute((1, 0)), s, is_async=True)\n",
            "s = _wgmma(q_second, kv_second.permute((1, 0)), s, is_async=True)\n"),
    # the first half's four k64 chunks from one register tile
    "q4": (f"q_reg = q_first.slice(0, 64, dim=1).load({DOT})\n"
           "s = _wgmma(q_reg, kv_first.slice(0, 64, dim=1).permute((1, 0)), s_zero, use_acc=False, is_async=True)\n"
           "for c in gl.static_range(1, 4):\n"
           "    s = _wgmma(q_reg, kv_first.slice(c * 64, 64, dim=1).permute((1, 0)), s, is_async=True)\n",
           "s = _wgmma(q_second, kv_second.permute((1, 0)), s, is_async=True)\n"),
    # Q's first half (64 x 256) in registers, used for both tile halves
    "qhalf": (f"q_reg = q_first.load({DOT})\n"
              "s = _wgmma(q_reg, kv_first.permute((1, 0)), s_zero, use_acc=False, is_async=True)\n",
              "s = _wgmma(q_reg, kv_second.permute((1, 0)), s, is_async=True)\n"),
}


def with_form(text: str, form: str) -> str:
    found = list(QK.finditer(text))
    assert len(found) == 1, len(found)
    m = found[0]
    first, second = FORMS[form]
    body = first + "".join(ln.lstrip() + "\n" for ln in m["between"].splitlines()) + second
    ind = m["i"]
    return text[:m.start()] + "".join(ind + ln + "\n" for ln in body.splitlines()) + text[m.end():]


if __name__ == "__main__":
    mma_gather = floor.variant_source(KERNEL, False, "mma")
    for form in FORMS:
        (HERE / f"ws_{form}.py").write_text(with_form(KERNEL, form))
        (HERE / f"mma_gather_{form}.py").write_text(with_form(mma_gather, form))
    print(sorted(p.name for p in HERE.glob("*.py")))
