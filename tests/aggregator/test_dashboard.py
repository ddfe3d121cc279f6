"""The dashboard: its assets are served by the app, and a real browser draws real data.

The browser tests start the app with uvicorn on a free port (in a thread), let three real
:class:`~edge_agent.agent.loop.Agent` loops train over the same ``memory://`` broker with
different link profiles, then run headless Chromium against the page: a screenshot
(decoded here with zlib, no imaging library) must show the loss curve in its colour, and
the DOM after the scripts ran must list the agents and hide the error banner.

Set ``CAT_EDGE_UPDATE_FIGURES=1`` to also copy the screenshot to docs/figures/dashboard.png.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient

from aggregator.localnet import HOST, free_port
from aggregator.service.settings import Settings
from aggregator.web.app import STATIC_DIR, create_app
from edge_agent.agent.loop import Agent, AgentConfig
from edge_agent.data import make_rcv1_like, split_shards, write_npz
from edge_agent.links.catalog import resolve_profile
from edge_agent.numerics.models import make_model
from edge_agent.transports import drop_broker, open_transport

JOB = "dashjob"
D = 400
ROUNDS = 15
PROFILES = ("lorawan_eu868_dr5_sf7", "ble5_2m_dle_notify", "nbiot_udp_psm_rai")
AGENTS = tuple(f"node-{i + 1}" for i in range(len(PROFILES)))
#: The loss curve colour: --loss in dashboard.css (light theme, which headless Chromium uses).
LOSS_RGB = (0x7B, 0x2C, 0xBF)
#: The first agent's colour on the T chart (AGENT_COLORS[0] in dashboard.js).
FIRST_AGENT_RGB = (0x00, 0x72, 0xB2)
#: The error banner background: --error-bg in dashboard.css.
BANNER_RGB = (0xFE, 0xE2, 0xE2)
WINDOW = (1280, 900)
FIGURE = Path(__file__).resolve().parents[2] / "docs" / "figures" / "dashboard.png"
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)


def make_settings(memory_url: str, data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "job": JOB,
        "d": D,
        "transports": [memory_url],
        "data_dir": data_dir,
        "tick_s": 0.02,
        "downlink_pacing": False,  # real time: LoRaWAN's daily downlink cap is tested apart
        "feedback": "any",  # plain agents: the first hello fixes the family
    }
    values.update(overrides)
    return Settings(**values)


# --------------------------------------------------------------------------- (a) assets


@pytest.fixture
def client(memory_url: str, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(memory_url, tmp_path / "data"))) as c:
        yield c


def test_index_is_the_dashboard_page(client: TestClient) -> None:
    resp = client.get("/")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    assert '<script src="/static/dashboard.js"' in resp.text
    assert 'href="/static/dashboard.css"' in resp.text


def test_script_is_served_as_javascript(client: TestClient) -> None:
    resp = client.get("/static/dashboard.js")
    assert resp.status_code == 200
    assert resp.headers["content-type"].split(";")[0] in {
        "text/javascript",
        "application/javascript",
    }


def test_stylesheet_is_served_as_css(client: TestClient) -> None:
    resp = client.get("/static/dashboard.css")
    assert resp.status_code == 200
    assert resp.headers["content-type"].split(";")[0] == "text/css"


def test_assets_load_nothing_from_other_hosts() -> None:
    for asset in sorted(STATIC_DIR.iterdir()):
        text = asset.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href|url)\s*[=(]\s*["']?(https?:)?//""", text), asset.name
        assert "@import" not in text and "fonts.googleapis" not in text, asset.name


def test_script_fetches_only_routes_the_app_serves(client: TestClient) -> None:
    script = (STATIC_DIR / "dashboard.js").read_text(encoding="utf-8")
    fetched = set(re.findall(r"""getJSON\([`"'](/[a-z]+)""", script))
    assert fetched == {"/status", "/agents", "/history"}
    for path in sorted(fetched):
        assert client.get(path).status_code == 200, path


# --------------------------------------------------------------------------- (b) browser


@dataclass
class LiveJob:
    url: str
    agents: tuple[str, ...]


@pytest.fixture(scope="module")
def live_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveJob]:
    """The app under uvicorn on a free port, after three real agents trained ROUNDS rounds."""
    if CHROMIUM is None:
        pytest.skip("chromium not found on PATH; install it (apt-get install chromium)")
    tmp = tmp_path_factory.mktemp("dashboard")
    rng = np.random.default_rng(7)
    data = make_rcv1_like(600, D, rng=rng, nnz_per_row=20)
    write_npz(data, tmp / "eval.npz")
    broker = f"dash-{uuid.uuid4().hex[:12]}"
    memory_url = f"memory://{broker}"
    settings = make_settings(
        memory_url, tmp / "data", eval_data=tmp / "eval.npz", max_rounds=ROUNDS
    )
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host=HOST, port=port, log_level="warning")
    )
    serving = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    serving.start()
    agents: list[Agent] = []
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert serving.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        for i, (shard, profile) in enumerate(
            zip(split_shards(data, len(PROFILES), rng=rng), PROFILES, strict=True)
        ):
            config = AgentConfig(
                job=JOB,
                agent_id=AGENTS[i],
                feedback="ef",
                duty_cycle="ignore",  # LoRaWAN would otherwise wait out its duty cycle
                max_rounds=ROUNDS,
                seed=i,
            )
            agent = Agent(
                config,
                model=make_model("logreg", n_features=D),
                data=shard,
                profile=resolve_profile(profile),
                transport=open_transport(memory_url, role="agent", client_id=AGENTS[i]),
            )
            agent.start()
            agents.append(agent)
        loops = [threading.Thread(target=a.run, daemon=True) for a in agents]
        for loop in loops:
            loop.start()
        for loop in loops:
            loop.join(timeout=20)
        assert not any(loop.is_alive() for loop in loops), "agents did not finish their rounds"
        base = f"http://{HOST}:{port}"
        rounds = httpx.get(f"{base}/history", timeout=5).json()["rounds"]
        assert len(rounds) == ROUNDS and rounds[-1]["loss"] is not None
        yield LiveJob(url=f"{base}/", agents=AGENTS)
    finally:
        for agent in agents:
            agent.stop()
            agent.close("offline")
        server.should_exit = True
        serving.join(timeout=10)
        drop_broker(broker)


def chromium(url: str, profile_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile_dir}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--virtual-time-budget=5000",
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, timeout=60, check=True)


def read_png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG: (width, height, rows of RGB bytes)."""
    blob = path.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, bytearray()
    width = height = channels = 0
    while pos < len(blob):
        (length,) = struct.unpack(">I", blob[pos : pos + 4])
        kind, body = blob[pos + 4 : pos + 8], blob[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, "unsupported PNG"
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(bytes(idat))
    stride, bpp = width * channels, channels
    prev = bytearray(stride)
    rows: list[bytes] = []
    for y in range(height):
        start = y * (stride + 1)
        filt, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if filt == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif filt == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif filt == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif filt == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(
            bytes(line) if channels == 3 else bytes(line[j] for j in range(stride) if j % 4 != 3)
        )
        prev = line
    return width, height, rows


def pixels_near(
    rows: list[bytes], rgb: tuple[int, int, int], tol: int = 6
) -> list[tuple[int, int]]:
    """(x, y) of every pixel within ``tol`` of ``rgb`` in each channel."""
    r0, g0, b0 = rgb
    found = []
    for y, row in enumerate(rows):
        for x in range(0, len(row), 3):
            if (
                abs(row[x] - r0) <= tol
                and abs(row[x + 1] - g0) <= tol
                and abs(row[x + 2] - b0) <= tol
            ):
                found.append((x // 3, y))
    return found


@pytest.mark.integration  # uvicorn on a real port and headless Chromium
def test_screenshot_shows_the_loss_curve_and_no_error(live_job: LiveJob, tmp_path: Path) -> None:
    shot = tmp_path / "dashboard.png"
    chromium(live_job.url, tmp_path / "profile", f"--screenshot={shot}")
    width, height, rows = read_png_rgb(shot)
    assert (width, height) == WINDOW

    loss = pixels_near(rows, LOSS_RGB)
    xs, ys = [x for x, _ in loss], [y for _, y in loss]
    # A curve over 15 rounds, not just the 18x4 px legend swatch: many pixels spanning
    # a wide and tall box, in the left chart (the charts sit side by side at 1280 px).
    assert len(loss) > 400, f"only {len(loss)} pixels in the loss colour"
    assert max(xs) - min(xs) > 250 and max(ys) - min(ys) > 150, (min(xs), max(xs), min(ys), max(ys))
    assert max(xs) < width // 2

    agent = pixels_near(rows, FIRST_AGENT_RGB)
    assert agent and max(x for x, _ in agent) - min(x for x, _ in agent) > 300, "no T line"
    assert not pixels_near(rows, BANNER_RGB, tol=2), "the disconnected banner is showing"
    if os.environ.get("CAT_EDGE_UPDATE_FIGURES"):
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, FIGURE)


class _Dom(HTMLParser):
    """Collects the text of each element with an id, the attributes by id, and table rows."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs_by_id: dict[str, dict[str, str | None]] = {}
        self.row_headers: list[str] = []
        self._in_body = False
        self._in_row_header = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.attrs_by_id[str(a["id"])] = a
        if a.get("id") == "agents-body":
            self._in_body = True
        elif self._in_body and tag == "th":
            self._in_row_header = True
            self.row_headers.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag == "th":
            self._in_row_header = False

    def handle_data(self, data: str) -> None:
        if self._in_row_header:
            self.row_headers[-1] += data.strip()


@pytest.mark.integration  # uvicorn on a real port and headless Chromium
def test_dom_lists_the_agents_and_hides_the_banner(live_job: LiveJob, tmp_path: Path) -> None:
    html = chromium(live_job.url, tmp_path / "profile", "--dump-dom").stdout.decode()
    dom = _Dom()
    dom.feed(html)
    assert dom.row_headers == list(live_job.agents)
    assert "hidden" in dom.attrs_by_id["banner"]
    assert dom.attrs_by_id["loss-chart"].get("data-points") not in (None, "0")
    for profile in PROFILES:
        assert profile in html
    assert f">{JOB}<" in html and f">v{ROUNDS}<" in html


def _cells(html: str, row: str) -> dict[str, str]:
    """The text of each ``data-metric`` cell of the directions row ``data-dir=row``."""
    found = re.search(rf'<tr data-dir="{row}"[^>]*>(.*?)</tr>', html, re.S)
    assert found, f"no {row} row in the directions table"
    cells = re.findall(r'<td[^>]*data-metric="(\w+)"[^>]*>(.*?)</td>', found.group(1), re.S)
    return {k: re.sub(r"<[^>]+>", " ", v) for k, v in cells}


def test_page_has_both_directions_and_a_downlink_column(client: TestClient) -> None:
    page = client.get("/").text
    for row in ("up", "down", "total"):
        assert set(_cells(page, row)) == {"messages", "bytes", "packets", "airtime_s", "energy_j"}
    head = page[page.index('<table id="agents">') : page.index('<tbody id="agents-body">')]
    assert ">Downlink</th>" in head and ">Total</th>" in head
    assert 'colspan="12"' in page  # the placeholder spans every column


@pytest.mark.integration  # uvicorn on a real port and headless Chromium
def test_dom_shows_uplink_downlink_and_total_against_dense(
    live_job: LiveJob, tmp_path: Path
) -> None:
    html = chromium(live_job.url, tmp_path / "profile", "--dump-dom").stdout.decode()
    status = httpx.get(live_job.url + "status", timeout=5).json()
    assert status["downlink"]["bytes"] > 0 and status["dense_equivalent_downlink"] is not None
    for row in ("up", "down", "total"):
        cells = _cells(html, row)
        assert re.search(r"\d+(\.\d+)? [kMG]?B", cells["bytes"]), (row, cells["bytes"])
        assert re.search(r"dense .* (less|more)$", cells["bytes"].strip()), (row, cells["bytes"])
    body = html[html.index('<tbody id="agents-body">') :]
    assert body.count('title="received:') == len(live_job.agents)  # the downlink column


@pytest.mark.integration  # uvicorn on a real port and headless Chromium
def test_dom_shows_what_the_agents_sent_and_received(live_job: LiveJob, tmp_path: Path) -> None:
    html = chromium(live_job.url, tmp_path / "profile", "--dump-dom").stdout.decode()
    status = httpx.get(live_job.url + "status", timeout=5).json()
    assert status["sent_total"]["messages"] > status["totals"]["updates"]  # hellos at least
    for row in ("sent", "sent_and_received"):
        cells = _cells(html, row)
        assert set(cells) == {"messages", "bytes", "packets", "airtime_s", "energy_j"}
        assert re.search(r"\d+(\.\d+)? [kMG]?B", cells["bytes"]), (row, cells["bytes"])
        assert "dense" not in cells["bytes"], (row, cells["bytes"])  # no baseline for these
    # the job is finished: the page shows what /status says
    assert _cells(html, "sent")["messages"].strip() == f"{status['sent_total']['messages']:,}"
