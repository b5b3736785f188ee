"""Config-space fuzzing: mutated real registers through inspect, plan and apply --root.

    python3 benchmarks/config_fuzz.py [--count 10000] [--seed N] [--pciutils DIR] [--json FILE]

Each round copies nothing: the trees of tests/data/hosts are copied once into a scratch folder,
and each round changes the ``config`` file of one PCI function there, runs ``gputunectl``
(in-process, through :func:`gputuned.cli.main`) and puts the bytes back:

- mutations of the trees' real registers: 1-6 bit flips in the bytes gputuned decodes (the
  header's first 16 bytes, the capability pointer, each capability header, the PCI Express
  capability's DevCap..LnkSta), one register set to all-ones, a reserved payload encoding (6
  or 7) in DevCap MPS, DevCtl MPS or DevCtl MRRS, the whole space all-ones (a device fallen
  off the bus), or the file truncated (0-255 bytes, 64 more often: an unprivileged read);
- with ``--pciutils DIR`` (the ``tests/`` folder of the pciutils repository: ``lspci -xxx``
  dumps of real hardware), a quarter of the rounds first put a real function's bytes from
  there in place of the tree's, then mutate those.

Then ``inspect --all`` (JSON or rendered, alternately), ``plan`` (the widest profile: PCIe
payload and ASPM, IRQs and a partition), ``apply --root`` and ``revert``. A round passes when
no command raises anything but gputuned's own errors (a traceback) or exits with a status other
than the documented ones, when every field the round made unreadable is named in inspect's
findings for that function ("not responding", "config space", "DevCap Max_Payload_Size", ...:
computed here from the bytes, independently of gputuned's parser), when no plan change shows
a payload size outside 128..4096 (a placeholder such as ``MRRS 0 -> 4096``), and when revert
succeeds. Every 500 rounds, and at the end, each tree must be byte-identical to its source.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import random
import re
import shutil
import struct
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputuned.cli import main as cli  # noqa: E402

TREES = REPO / "tests" / "data" / "hosts"
#: Tree and weight: the 24-function dual-socket tree costs five times the small ones per round.
WEIGHTS = {
    "h200-vm": 3, "h200-captured": 3, "degraded-link": 3, "ci-vm": 1, "two-gpu-one-node": 2,
    "four-gpu-one-socket": 1, "dual-socket-8gpu": 2,
}  # fmt: skip
SIZES = {"128", "256", "512", "1024", "2048", "4096"}
PROFILE = """name = "fuzz"
[cpusets.housekeeping]
cpus = "0"
[cpusets.inference]
gpu_local = 0
exclude = ["housekeeping"]
count = 4
[cpuset]
mode = "root"
cpus = "inference"
[irq]
gpu_cpus = "inference"
others_cpus = "housekeeping"
default_affinity = "housekeeping"
[pcie_aspm]
policy = "performance"
gpu_links = "disable"
[pcie_payload]
mps = "max-safe"
mrrs = 512
allow_mps_change = true
"""


# -- an oracle written from the specification, not from gputuned's parser --------------------


def expected_unreadable(raw: bytes) -> set[str]:
    """The field names a report must give for these bytes (PCI r3.0 6.1, PCIe r6.0 7.5.3).

    ``raw`` is what the config file holds, maybe cut short. Unreadable is what gputuned
    decodes and cannot have: the header's first 16 bytes and the capability pointer, each
    capability header on the list, the PCIe capability's DevCap..LnkSta. One of them past the
    end of the file (within the 256-byte standard space) makes the space unreadable past what
    was read; a PCIe capability whose registers run past 256 bytes is named itself. Bytes the
    parser never reads (the rest of the header of a function without capabilities) make
    nothing unreadable.
    """
    if len(raw) >= 2 and raw[:2] == b"\xff\xff":
        return {"not responding"}
    if len(raw) < 0x38:  # the first 16 bytes or the capability pointer are missing
        return {"config space"}
    status = raw[6] | raw[7] << 8
    if not status & 0x10:
        return set()
    ptr, seen = raw[0x34] & 0xFC, set()
    while ptr >= 0x40 and ptr not in seen:
        seen.add(ptr)
        if ptr + 4 > len(raw):
            return {"config space"}
        if raw[ptr] == 0x10:
            if ptr + 0x14 > 256:
                return {f"PCI Express capability at {ptr:#x}"}
            if ptr + 0x14 > len(raw):
                return {"config space"}
            devcap = struct.unpack_from("<I", raw, ptr + 4)[0]
            devctl = struct.unpack_from("<H", raw, ptr + 8)[0]
            out = set()
            if devcap & 7 > 5:
                out.add("DevCap Max_Payload_Size")
            if (devctl >> 5) & 7 > 5:
                out.add("DevCtl Max_Payload_Size")
            if (devctl >> 12) & 7 > 5:
                out.add("DevCtl Max_Read_Request_Size")
            return out
        ptr = raw[ptr + 1] & 0xFC
    return set()


# -- mutations -------------------------------------------------------------------------------


def decoded_offsets(raw: bytes) -> list[int]:
    """Byte offsets gputuned reads (read_registers): header, pointer, capability headers and
    the PCIe capability's registers."""
    offs = [*range(16), 0x34]
    if len(raw) < 256 or not raw[6] & 0x10:
        return offs
    ptr, seen = raw[0x34] & 0xFC, set()
    while ptr >= 0x40 and ptr not in seen and ptr + 4 <= len(raw):
        seen.add(ptr)
        offs += range(ptr, ptr + 4)
        if raw[ptr] == 0x10:
            offs += range(ptr + 4, min(ptr + 0x14, len(raw)))
        ptr = raw[ptr + 1] & 0xFC
    return offs


def pcie_cap(raw: bytes) -> int | None:
    if len(raw) < 256 or not raw[6] & 0x10:
        return None
    ptr, seen = raw[0x34] & 0xFC, set()
    while ptr >= 0x40 and ptr not in seen and ptr + 0x14 <= len(raw):
        seen.add(ptr)
        if raw[ptr] == 0x10:
            return ptr
        ptr = raw[ptr + 1] & 0xFC
    return None


def mutate(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    b = bytearray(raw)
    cap = pcie_cap(raw)
    kind = rng.choices(["flip", "register", "reserved", "all-ones", "truncate"], [5, 2, 2, 1, 2])[0]
    if kind in ("register", "reserved") and cap is None:
        kind = "flip"
    if kind == "flip":
        offs = decoded_offsets(raw)
        n = rng.randint(1, 6)
        for _ in range(n):
            b[rng.choice(offs)] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip {n} bit(s)"
    if kind == "register":
        assert cap is not None
        reg, size = rng.choice([(4, 4), (8, 2), (0xC, 4), (0x10, 2), (0x12, 2)])
        b[cap + reg : cap + reg + size] = b"\xff" * size
        return bytes(b), f"register +{reg:#x} all-ones"
    if kind == "reserved":
        assert cap is not None
        reg, mask, shift, name = rng.choice(
            [(4, 0x7, 0, "DevCap MPS"), (8, 0xE0, 5, "DevCtl MPS"), (8, 0x7000, 12, "MRRS")]
        )
        fmt = "<I" if reg == 4 else "<H"
        v = struct.unpack_from(fmt, b, cap + reg)[0]
        struct.pack_into(fmt, b, cap + reg, (v & ~mask) | (rng.choice((6, 7)) << shift))
        return bytes(b), f"reserved {name}"
    if kind == "all-ones":
        return b"\xff" * len(raw), "all-ones"
    n = rng.choice([0, 1, 2, 12, 16, 63, 64, 64, 64, 65, 128, rng.randrange(256)])
    return bytes(b[:n]), f"truncated to {n}"


def pciutils_dumps(folder: Path) -> list[bytes]:
    """Every function of every ``lspci -xxx`` dump in ``folder`` of at least 256 bytes."""
    out = []
    head = re.compile(r"^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\s")
    row = re.compile(r"^([0-9a-f]+): ((?:[0-9a-f]{2} ?)+)$")
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        data: dict[int, int] = {}
        for line in [*f.read_text(errors="replace").splitlines(), "00:00.0 end"]:
            if head.match(line):
                if len(data) >= 256:
                    out.append(bytes(data.get(i, 0) for i in range(max(data) + 1)))
                data = {}
            elif m := row.match(line.strip()):
                for i, byte in enumerate(m.group(2).split()):
                    data[int(m.group(1), 16) + i] = int(byte, 16)
    return out


# -- running ---------------------------------------------------------------------------------


@dataclass
class Figures:
    rounds: int = 0
    by_mutation: dict[str, int] = field(default_factory=dict)
    tracebacks: list[str] = field(default_factory=list)
    bad_exit: list[str] = field(default_factory=list)
    unreported: list[str] = field(default_factory=list)
    placeholders: list[str] = field(default_factory=list)
    revert_failed: list[str] = field(default_factory=list)
    tree_changed: list[str] = field(default_factory=list)
    unreadable_rounds: int = 0
    fields_named: int = 0
    pciutils_rounds: int = 0
    seconds: float = 0.0


def run(args: list[str]) -> tuple[int | None, str, str]:
    """gputunectl ARGS in this process: (exit status or None on a traceback, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | None = cli.main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # anything but gputuned's own errors, which main() catches
            err.write(traceback.format_exc())
            code = None
    return code, out.getvalue(), err.getvalue()


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if rel.startswith(("run", "etc")):
            continue
        h.update(rel.encode())
        h.update(b"L" + str(p.readlink()).encode() if p.is_symlink() else b"")
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def one_round(
    n: int, root: Path, cfg: Path, raw: bytes, prof: Path, rng: random.Random, fig: Figures
) -> None:
    bdf = cfg.parent.name
    mutated, what = mutate(raw, rng)
    label = f"round {n} {root.name} {bdf} {what}"
    fig.by_mutation[what.split()[0]] = fig.by_mutation.get(what.split()[0], 0) + 1
    want = expected_unreadable(mutated)
    fig.unreadable_rounds += bool(want)
    cfg.write_bytes(mutated)
    try:
        as_json = n % 2 == 0
        fmt = ["--json"] if as_json else []
        code, out, err = run(["inspect", "--all", "--root", str(root), *fmt])
        _check(fig, label, "inspect", code, err, (0,))
        if code == 0:
            _check_named(fig, label, bdf, want, out, as_json)
        code, out, err = run(["plan", str(prof), "--root", str(root), *fmt])
        _check(fig, label, "plan", code, err, (0, 4))
        if code is not None:
            _check_placeholders(fig, label, out, as_json)
        code, out, err = run(["apply", str(prof), "--root", str(root), "--json"])
        _check(fig, label, "apply", code, err, (0, 3, 4))
        code, out, err = run(["revert", "--root", str(root), "--json"])
        _check(fig, label, "revert", code, err, (0,))
        if code != 0:
            fig.revert_failed.append(f"{label}: {out[-300:]} {err[-300:]}")
    finally:
        cfg.write_bytes(raw)


def _check(
    fig: Figures, label: str, cmd: str, code: int | None, err: str, ok: tuple[int, ...]
) -> None:
    if code is None or "Traceback" in err:
        fig.tracebacks.append(f"{label}: {cmd}: {err.strip().splitlines()[-1:]}")
    elif code not in ok:
        fig.bad_exit.append(f"{label}: {cmd} exit {code}: {' '.join(err.split())[:300]}")


def _check_named(
    fig: Figures, label: str, bdf: str, want: set[str], out: str, as_json: bool
) -> None:
    if as_json:
        devs = {d["bdf"]: d for d in json.loads(out)["devices"]}
        text = " | ".join(f["message"] for f in devs.get(bdf, {}).get("findings", []))
    else:
        flat = " ".join(out.split())
        text = " | ".join(
            re.findall(rf"\w+ {re.escape(bdf)}: [^|]*?(?= (?:fault|note|unreadable) \d|$)", flat)
        )
    for name in want:
        if name in text:
            fig.fields_named += 1
        else:
            fig.unreported.append(f"{label}: {name!r} not named ({text[:200]!r})")


def _check_placeholders(fig: Figures, label: str, out: str, as_json: bool) -> None:
    if as_json:
        for c in json.loads(out)["changes"]:
            if c["kind"] == "pcie" and not {c["current"], c["wanted"]} <= SIZES:
                fig.placeholders.append(f"{label}: {c['target']} {c['current']} -> {c['wanted']}")
    elif re.search(r"(MPS|MRRS)\s.*?\b(None|0) →", " ".join(out.split())):
        fig.placeholders.append(f"{label}: {' '.join(out.split())[:300]}")


def fuzz(count: int, rng: random.Random, extra: list[bytes], fig: Figures) -> None:
    t0 = time.monotonic()
    # tmpfs when there is one: apply fsyncs its journal before every write.
    shm = Path("/dev/shm")  # noqa: S108  a private mkdtemp folder under it
    scratch = str(shm) if shm.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="gputuned-cfgfuzz-", dir=scratch) as tmp:
        prof = Path(tmp) / "fuzz.toml"
        prof.write_text(PROFILE)
        roots = {name: Path(tmp) / name for name in WEIGHTS}
        for name, r in roots.items():
            shutil.copytree(TREES / name, r, symlinks=True)
        sources = {name: digest(r) for name, r in roots.items()}
        configs = {
            n: sorted(r.joinpath("sys", "devices").rglob("config")) for n, r in roots.items()
        }
        for n in range(1, count + 1):
            tree = rng.choices(list(WEIGHTS), list(WEIGHTS.values()))[0]
            cfg = rng.choice(configs[tree])
            raw = cfg.read_bytes()
            start = raw
            if extra and rng.random() < 0.25:
                fig.pciutils_rounds += 1
                start = rng.choice(extra)
                cfg.write_bytes(start)
            try:
                one_round(n, roots[tree], cfg, start, prof, rng, fig)
            finally:
                cfg.write_bytes(raw)
            fig.rounds = n
            if n % 500 == 0 or n == count:
                for name, r in roots.items():
                    if digest(r) != sources[name]:
                        fig.tree_changed.append(f"after round {n}: {name}")
                        shutil.rmtree(r)
                        shutil.copytree(TREES / name, r, symlinks=True)
                print(f"config_fuzz: {n} rounds, {len(fig.tracebacks)} tracebacks, "
                      f"{len(fig.unreported)} unreported, {time.monotonic() - t0:.0f} s",
                      flush=True)  # fmt: skip
    fig.seconds = round(time.monotonic() - t0, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--pciutils", type=Path, help="pciutils' tests/ folder (lspci -xxx dumps)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)  # noqa: S311  fuzzing
    rng = random.Random(seed)  # noqa: S311  reproducible from the printed seed
    fig = Figures()
    fuzz(a.count, rng, pciutils_dumps(a.pciutils) if a.pciutils else [], fig)
    bad = {
        "tracebacks": fig.tracebacks, "unexpected exit": fig.bad_exit,
        "unreadable field not named": fig.unreported, "placeholder in a plan": fig.placeholders,
        "revert failed": fig.revert_failed, "tree not restored": fig.tree_changed,
    }  # fmt: skip
    doc: dict[str, Any] = {"seed": seed, **fig.__dict__, "ok": not any(bad.values())}
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"config_fuzz seed {seed}: {fig.rounds} mutated config spaces through inspect, plan, "
        f"apply --root and revert in {fig.seconds:.0f} s ({fig.pciutils_rounds} from pciutils "
        f"dumps); mutations {fig.by_mutation}; {fig.unreadable_rounds} made a field unreadable, "
        f"{fig.fields_named} field names found in inspect"
    )
    for what, items in bad.items():
        print(f"  {what}: {len(items)}")
        for item in items[:10]:
            print(f"    {item}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
