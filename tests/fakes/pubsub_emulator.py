"""Google's own Pub/Sub emulator, started on a free port and stopped by pid.

The Cloud SDK ships it as ``platform/pubsub-emulator/bin/cloud-pubsub-emulator``, a
shell script that ``exec``s Java: started directly, the process we spawn *is* the
Java server, so stopping it by that pid leaves nothing behind. ``gcloud beta
emulators pubsub start`` is only the fallback: it runs Java as a child that outlives
a killed wrapper, so every descendant is found in /proc and stopped by its own pid.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

INSTALL_HINT = (
    "Google's Pub/Sub emulator is required for the Pub/Sub tests and was not found. "
    "Install it with `apt-get install google-cloud-cli-pubsub-emulator default-jre-headless` "
    "(or `gcloud components install pubsub-emulator` with Java 11+ on PATH), or set "
    "FALCON_PUBSUB_EMULATOR to the path of the cloud-pubsub-emulator script."
)
SCRIPT = Path("platform/pubsub-emulator/bin/cloud-pubsub-emulator")
KNOWN_SDK_ROOTS = ("/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk",
                   "/opt/google-cloud-sdk", "/google-cloud-sdk")
PROJECT = "falcon-test"
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 10.0


class EmulatorError(RuntimeError):
    """The emulator is missing or did not come up (the message says why and what to do)."""


def emulator_command(host: str, port: int) -> list[str]:
    """The command that runs the emulator on host:port; EmulatorError when absent."""
    if shutil.which("java") is None:
        raise EmulatorError("java is not on PATH. " + INSTALL_HINT)
    script = _find_script()
    if script is not None:
        return [str(script), f"--host={host}", f"--port={port}"]
    gcloud = shutil.which("gcloud")
    if gcloud is not None:
        return [gcloud, "beta", "emulators", "pubsub", "start", f"--host-port={host}:{port}",
                f"--project={PROJECT}", "--quiet"]
    raise EmulatorError(INSTALL_HINT)


def _find_script() -> Path | None:
    configured = os.environ.get("FALCON_PUBSUB_EMULATOR")
    if configured:
        path = Path(configured)
        if not path.is_file():
            raise EmulatorError(f"FALCON_PUBSUB_EMULATOR={configured} is not a file. "
                                + INSTALL_HINT)
        return path
    roots = [Path(root) for root in KNOWN_SDK_ROOTS]
    gcloud = shutil.which("gcloud")
    if gcloud is not None:
        roots.append(Path(os.path.realpath(gcloud)).parent.parent)
    for root in roots:
        if (root / SCRIPT).is_file():
            return root / SCRIPT
    if gcloud is not None:
        found = subprocess.run(
            [gcloud, "info", "--format=value(installation.sdk_root)"],
            capture_output=True, text=True, timeout=60, check=False,
        ).stdout.strip()
        if found and (Path(found) / SCRIPT).is_file():
            return Path(found) / SCRIPT
    on_path = shutil.which("cloud-pubsub-emulator")
    return Path(on_path) if on_path else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class PubSubEmulator:
    host: str  # "127.0.0.1:PORT", the value of PUBSUB_EMULATOR_HOST
    project: str
    pid: int
    log_path: Path
    started_in_seconds: float
    _process: subprocess.Popen[bytes]

    @classmethod
    def start(cls, log_dir: Path, *, timeout: float = START_TIMEOUT_SECONDS) -> PubSubEmulator:
        port = free_port()
        command = emulator_command("127.0.0.1", port)
        log_path = log_dir / f"pubsub-emulator-{port}.log"
        began = time.monotonic()
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        emulator = cls(f"127.0.0.1:{port}", PROJECT, process.pid, log_path, 0.0, process)
        try:
            emulator._wait_until_listening(port, began + timeout)
        except BaseException:
            emulator.stop()
            raise
        emulator.started_in_seconds = time.monotonic() - began
        return emulator

    def _wait_until_listening(self, port: int, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EmulatorError(
                    f"the Pub/Sub emulator exited with status {self._process.returncode}: "
                    f"{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise EmulatorError(f"the Pub/Sub emulator did not listen on {self.host} in time: "
                            f"{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the emulator and every process it started, each by its own pid."""
        pids = [*_descendants(self.pid), self.pid]
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            _signal(self.pid, signal.SIGKILL)
            self._process.wait(timeout=STOP_TIMEOUT_SECONDS)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for pid in pids[:-1]:
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                _signal(pid, signal.SIGKILL)

    def is_running(self) -> bool:
        return self._process.poll() is None


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (deepest first), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return list(reversed(found))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
