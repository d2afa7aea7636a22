"""The GPU Fabric Lab page (slurmfabric/whatif/lab.py + lab.html): its numbers are the
model's, it is self-contained, and it works in a real headless Chromium (Debian's
``chromium`` package: CI installs it; a missing browser is a failure, not a skip).

The browser is driven two ways: the page's state in the URL fragment with
``--dump-dom`` / ``--screenshot``, and its controls through the DevTools protocol over
``--remote-debugging-pipe`` (no extra Python package). ``SLURMFABRIC_UPDATE_SCREENSHOTS=1``
writes the two screenshots docs/whatif.md shows into docs/img/."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cleanenv import clean_env

from slurmfabric.whatif import lab
from slurmfabric.whatif import model as whatif

REPO = Path(__file__).resolve().parents[2]
HEALTHY = "fabric=ib&nodes=16&model=llama3-70b&gpu=h100&overlap=0&faults="
CABLE = "fabric=ib&nodes=16&model=llama3-70b&gpu=h100&overlap=0&faults=cable"


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lab") / "lab.html"
    env = clean_env()
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "whatif", "--html", str(path)],
                          capture_output=True, text=True, env=env, cwd=path.parent)
    assert proc.returncode == 0, proc.stderr
    return path


def whatif_json(args: list[str]) -> dict:
    env = clean_env()
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "whatif", *args, "--json"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def embedded(path: Path) -> dict:
    text = path.read_text()
    start = text.index("const LAB = ") + len("const LAB = ")
    return json.loads(text[start:text.index(";\nconst $ =", start)].replace("<\\/", "</"))


def test_the_page_is_self_contained_and_its_numbers_are_the_models(page) -> None:
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "@import" not in text and "url(" not in text and "fetch(" not in text
    assert "default-src 'none'" in text  # the browser itself refuses any request
    data = embedded(page)
    assert data["nodes"] == [*range(1, 17), 32, 64, 128, 256, 512]
    assert set(data["fabrics"]) == {"ib", "roce", "tcp", "efa"}
    # every combination of the controls is there, and a sample equals the model
    assert len(data["cases"]) > 10000
    for fabric, nodes, model, gpu, overlap, faults in (
            ("ib", 16, "llama3-70b", "h100", "0", ("cable",)),
            ("roce", 8, "llama3-8b", "b200", "0.5", ("gpu", "pfc")),
            ("tcp", 4, "gpt3-175b", "a100", "0", ()),
            ("efa", 512, "llama3-405b", "h200", "0.5", ("cable", "gdr"))):
        step = lab.case(fabric, nodes, model, gpu, faults, overlap)
        row = data["cases"]["|".join([fabric, str(nodes), model, gpu, overlap,
                                      ",".join(faults)])]
        assert row[:5] == pytest.approx([step.seconds, step.compute, step.comm, step.exposed,
                                         step.busbw], rel=1e-5)
        assert data["limits"][row[7]] == step.limit


def test_the_page_agrees_with_whatif_json_for_the_same_arguments(page) -> None:
    """The page's 'same case on the command line' arguments, run: the same step time."""
    data = embedded(page)
    for state in (("ib", 16, "llama3-70b", "h100", ("cable",), "0"),
                  ("roce", 2, "llama3-8b", "h200", ("gdr", "pfc"), "0.5"),
                  ("efa", 64, "llama3-405b", "b200", ("gpu",), "0")):
        fabric, nodes, model, gpu, faults, overlap = state
        out = whatif_json(lab.cli_args(fabric, nodes, model, gpu, faults, overlap))
        row = data["cases"]["|".join([fabric, str(nodes), model, gpu, overlap, ",".join(faults)])]
        assert out["step"]["seconds"] == pytest.approx(row[0], rel=1e-5)
        kinds = {f["kind"] for f in out["faults"]}
        assert kinds == {lab.FAULT_KIND[f] for f in faults}


def test_faults_that_cannot_happen_are_not_offered() -> None:
    assert lab.applicable("ib", 1) == ["gpu"]  # one node: no cable between nodes
    assert lab.applicable("tcp", 8) == ["gpu"]  # no RDMA, no lossless hop
    assert lab.applicable("roce", 2) == ["cable", "gpu", "gdr", "pfc"]
    assert lab.applicable("ib", 2) == ["cable", "gpu", "gdr"]
    # PFC is RoCE's: on IB the flag is refused, one line, exit 2
    env = clean_env()
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "whatif", "--model", "llama3-8b",
                           "--no-pfc", "n2"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "--fabric roce" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the real browser --------------------------------------------------------------------

def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no headless Chromium: install Debian's 'chromium' package (CI installs it)")


def browser_args(profile: Path) -> list[str]:
    return [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--hide-scrollbars"]


class Dom(HTMLParser):
    """Text of each element with an id, the body's attributes, the fault sections."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.body: dict[str, str | None] = {}
        self.faults: list[str] = []
        self.codes: list[str] = []
        self.html = ""
        self._open: list[tuple[str, str | None]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if a.get("data-fault"):
            self.faults.append(a["data-fault"] or "")
        if tag not in ("input", "meta", "br"):
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag) -> None:
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data) -> None:
        for _tag, ident in self._open:
            if ident:
                self.text[ident] = self.text.get(ident, "") + data
        if self._open and self._open[-1][0] == "code":
            self.codes.append(data)


def dump(path: Path, state: str, profile: Path) -> Dom:
    proc = subprocess.run([*browser_args(profile), "--virtual-time-budget=3000", "--dump-dom",
                           f"{path.as_uri()}#{state}"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Dom(proc.stdout)
    dom.html = proc.stdout
    return dom


def check_case(dom: Dom, expected_s: float, faults: list[str]) -> None:
    assert dom.body.get("data-ready") == "yes", "the page's script did not run"
    assert dom.text["step"].strip() == f"{expected_s:.2f} s"
    assert dom.text["requests"] == "0"
    assert dom.faults == faults


def test_the_page_in_chromium_shows_the_models_step_and_the_commands(page, tmp_path) -> None:
    """The issue's two cases: 16 x 8 H100 on InfiniBand, healthy and with one cable halved
    (no overlap, so the cable shows); the step shown equals whatif --json's."""
    args = lab.cli_args("ib", 16, "llama3-70b", "h100", (), "0")
    healthy = whatif_json(args)["step"]["seconds"]
    halved = whatif_json([*args, "--halve-cable", lab.CABLE_NODE])["step"]["seconds"]
    assert halved > healthy * 1.05
    dom = dump(page, HEALTHY, tmp_path / "p")
    check_case(dom, healthy, [])
    dom = dump(page, CABLE, tmp_path / "p")
    check_case(dom, halved, ["cable"])
    commands = " ".join(dom.codes)
    for finder in ("slurmfabric pairs", "slurmfabric ib audit", "ibstat", "perfquery -x",
                   "ethtool"):
        assert finder in commands, finder
    assert f"healthy {healthy:.2f} s" in dom.text["delta"]
    assert dom.text["cli"].endswith("--halve-cable node02")
    # every control has a label: the selects by for=, each radio and checkbox inside its own
    for select in ("nodes", "model", "gpu", "overlap"):
        assert f'<label for="{select}">' in dom.html
    shown = re.sub(r"<script>.*?</script>", "", dom.html, flags=re.S)
    controls = re.findall(r"<input [^>]*>", shown)
    wrapped = re.findall(r"<label[^>]*><input [^>]*>", shown)
    assert len(controls) == len(wrapped) == 8
    # the other faults list their own tools
    dom = dump(page, "fabric=roce&nodes=4&model=llama3-8b&gpu=h100&overlap=0"
               "&faults=gpu,gdr,pfc", tmp_path / "p")
    assert dom.faults == ["gpu", "gdr", "pfc"]
    commands = " ".join(dom.codes)
    for finder in ("slurmfabric health check", "nvidia-smi -q -d PERFORMANCE,CLOCK",
                   "slurmfabric nccl-log", "slurmfabric roce audit", "ethtool -S"):
        assert finder in commands, finder


def test_a_broken_script_fails_the_check(page, tmp_path) -> None:
    """The values only exist once the script ran: a page whose script does not parse shows
    its placeholder, and check_case says so."""
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("function render() {", "function render( {", 1))
    dom = dump(broken, HEALTHY, tmp_path / "p")
    assert dom.body.get("data-ready") == "no"
    with pytest.raises(AssertionError, match="did not run"):
        check_case(dom, 1.0, [])


def screenshot(path: Path, state: str, out: Path, profile: Path) -> None:
    proc = subprocess.run([*browser_args(profile), "--virtual-time-budget=3000",
                           "--window-size=1000,1250", f"--screenshot={out}",
                           f"{path.as_uri()}#{state}"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 400_000


def test_screenshots_of_the_healthy_and_the_halved_cable_case(page, tmp_path) -> None:
    update = os.environ.get("SLURMFABRIC_UPDATE_SCREENSHOTS") == "1"
    where = REPO / "docs" / "img" if update else tmp_path
    for name, state in (("whatif-lab-healthy.png", HEALTHY), ("whatif-lab-cable.png", CABLE)):
        screenshot(page, state, where / name, tmp_path / "p")
    doc = (REPO / "docs" / "whatif.md").read_text()
    assert "img/whatif-lab-healthy.png" in doc and "img/whatif-lab-cable.png" in doc
    for name in ("whatif-lab-healthy.png", "whatif-lab-cable.png"):
        assert (REPO / "docs" / "img" / name).stat().st_size > 5_000


# -- DevTools protocol over a pipe: drive the controls, watch the network ------------------

class Devtools:
    """Chrome DevTools protocol over --remote-debugging-pipe: JSON messages ending in NUL,
    commands on the browser's fd 3, answers and events on its fd 4."""

    def __init__(self, profile: Path) -> None:
        to_browser_r, self._w = os.pipe()
        self._r, from_browser_w = os.pipe()

        def on_3_and_4() -> None:  # in the child: the pipe ends become fds 3 and 4
            r, w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [*browser_args(profile), "--remote-debugging-pipe", "about:blank"],
            pass_fds=(3, 4, to_browser_r, from_browser_w), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=on_3_and_4)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf, self._id, self.events = b"", 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    assert "error" not in reply, reply
                    return reply["result"]
                self.events.append(reply)
            chunk = os.read(self._r, 1 << 16)
            assert chunk, "the browser closed the pipe"
            self._buf += chunk
        raise AssertionError(f"no answer to {method}")

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


def test_driving_the_controls_changes_the_numbers_to_the_models(page, tmp_path) -> None:
    """Through the DevTools protocol: load the page (every request recorded), pick 4 nodes
    and tick the slow GPU and the halved cable the way a user would (change events), and
    read the step time: the model's for that case. Only the page's own file is loaded."""
    tools = Devtools(tmp_path / "p")
    try:
        (target,) = [t for t in tools.send("Target.getTargets")["targetInfos"]
                     if t["type"] == "page"]
        session = tools.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                       "flatten": True})["sessionId"]
        tools.send("Network.enable", session=session)
        tools.send("Page.enable", session=session)
        tools.send("Page.navigate", {"url": f"{page.as_uri()}#{HEALTHY}"}, session=session)

        def js(expr: str) -> object:
            for _ in range(100):
                out = tools.send("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                                 session=session)["result"].get("value")
                if out is not None:
                    return out
                time.sleep(0.1)
            raise AssertionError(f"no value for {expr}")

        assert js("document.body && document.body.dataset.ready === 'yes' ? 1 : null") == 1
        js("(() => { const n = document.getElementById('nodes'); n.value = '4';"
           " n.dispatchEvent(new Event('change', {bubbles: true}));"
           " for (const v of ['gpu', 'cable']) { const b = document.querySelector("
           "'input[name=fault][value=' + v + ']'); b.click(); } return 1; })()")
        shown = js("document.getElementById('step').textContent")
        hash_now = js("location.hash")
        expected = lab.case("ib", 4, "llama3-70b", "h100", ("cable", "gpu"), "0").seconds
        assert shown == f"{expected:.2f} s"
        assert hash_now == "#fabric=ib&nodes=4&model=llama3-70b&gpu=h100&overlap=0&faults=cable,gpu"
        assert js("document.querySelectorAll('#finders section').length") == 2
        requests = [e["params"]["request"]["url"] for e in tools.events
                    if e.get("method") == "Network.requestWillBeSent"]
        assert requests and all(u.startswith(page.as_uri()) for u in requests), requests
    finally:
        tools.close()


def test_whatif_model_step_is_what_the_lab_calls() -> None:
    """lab.case is the model's step for the lab's job, not a copy of it."""
    job = lab.lab_job("ib", 16, "llama3-70b", "h100", ("cable",), "0")
    assert lab.case("ib", 16, "llama3-70b", "h100", ("cable",), "0") == whatif.step(job)
    assert job.slow_link == (lab.CABLE_NODE, 0.5) and job.overlap == 0.0


def test_the_page_opens_on_the_cable_fault_and_says_why_it_hides(page, tmp_path) -> None:
    """The first view is 16 InfiniBand nodes with one cable halved at FSDP's overlap, where
    the fault costs nothing: the page says why, and what it costs with no overlap."""
    assert lab.DEFAULT["faults"] == "cable"
    hidden = lab.case("ib", 16, "llama3-70b", "h100", ("cable",), "0.5")
    healthy = lab.case("ib", 16, "llama3-70b", "h100", (), "0.5")
    assert hidden.seconds == pytest.approx(healthy.seconds)  # the fault hides here
    bare = lab.case("ib", 16, "llama3-70b", "h100", ("cable",), "0")
    lost = 1 - lab.case("ib", 16, "llama3-70b", "h100", (), "0").seconds / bare.seconds
    dom = dump(page, "", tmp_path / "p")  # no state in the URL: the default view
    check_case(dom, hidden.seconds, ["cable"])
    why = " ".join(dom.text["finders"].split())
    assert "Hidden behind the compute here" in why
    assert f"its collectives take {hidden.comm:.2f} s (healthy {healthy.comm:.2f} s)" in why
    assert f"With no overlap it costs {100 * lost:.1f} % of the throughput" in why
    assert lost > 0.05
    # where the fault shows, there is nothing to explain
    dom = dump(page, CABLE, tmp_path / "p")
    assert "Hidden behind" not in dom.text["finders"]


def test_a_job_that_does_not_fit_says_so_instead_of_a_step_time(page, tmp_path) -> None:
    from slurmfabric.whatif import memory

    data = embedded(page)
    job = lab.lab_job("ib", 1, "llama3-405b", "h100")
    assert data["too_big"]["1|llama3-405b|h100"] == memory.refusal(job)
    assert "16|llama3-70b|h100" not in data["too_big"]
    dom = dump(page, "fabric=ib&nodes=1&model=llama3-405b&gpu=h100&overlap=0&faults=",
               tmp_path / "p")
    assert dom.text["step"] == "does not fit in GPU memory"
    assert "This job cannot start: the model does not fit: 812 GB" in dom.text["fit"]


def test_the_held_out_figures_sit_beside_the_busbw_points(page, tmp_path) -> None:
    """The page's last section: the nccl-tests busbw points and the training runs the model
    was not fitted on, the model's figure beside each published one, and the guide's TCP
    example, as steps.py and calibration.py compute them."""
    from slurmfabric.whatif import calibration, steps

    data = embedded(page)["held_out"]
    assert data == json.loads(json.dumps(lab.held_out()))
    held = [r for r in calibration.evaluate(calibration.points()) if r["set"] == "held-out"]
    assert [r["id"] for r in data["busbw"]] == [r["id"] for r in held]
    dom = dump(page, HEALTHY, tmp_path / "p")
    shown = dom.text["held-steps"]
    for row in steps.evaluate():
        assert f"{row['id']}{row['family']}{row['gpus']}{row['published']:g}" \
            f"{row['model']:.1f}" in shown, row["id"]
    assert "MISS 10 %: the model lets FSDP's per-layer all-gathers" in shown
    assert "H7H200 248 nodes" in dom.text["held-busbw"]
    assert dom.text["held-tcp"] == steps.tcp_text(steps.tcp_example())
