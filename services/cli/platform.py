"""The platform's own commands: run it (``up``), its state (``status``), API keys, the database.

The ``kernelzero`` command is these plus every service's commands, put together in ``kernelzero.cli``
(the composition root), so this shared layer depends on no service."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import psutil
import redis
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from services import auth
from services.cli.launcher import (
    AlreadyRunning,
    Launcher,
    PortInUse,
    check_ports_free,
    hold_instance_lock,
    redis_answers,
    run_state_path,
    stop_running_up,
)
from services.config import SERVICE_NAMES, get_settings
from services.db import migrate
from services.queue.names import GENERATION, PROPOSAL, TRAINING, scoring_queues

app = typer.Typer(
    help="KernelZero: co-evolving task Proposer and kernel Coder around a sandboxed reward service.", no_args_is_help=True
)
apikey_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
db_app = typer.Typer(help="Database migrations.", no_args_is_help=True)
app.add_typer(apikey_app, name="apikey")
app.add_typer(db_app, name="db")
console = Console()


def _print_version(value: bool) -> None:
    if value:
        print(f"kernelzero {importlib.metadata.version('kernelzero')}")
        raise typer.Exit()


@app.callback()
def _interruptible(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the installed version and exit."
    ),
) -> None:
    # A shell without job control (a script, `sh -c`) starts a background job (`&`) with SIGINT ignored, and
    # Python then installs no handler of its own: Ctrl-C and kill -INT would not stop `eval`, `train` or `up`.
    # Every command here is one a person may want to stop, so each gets Python's KeyboardInterrupt back.
    signal.signal(signal.SIGINT, signal.default_int_handler)


@app.command()
def up(
    no_auth: bool = typer.Option(False, "--no-auth", help="Turn API-key auth off (local experiments only)."),
) -> None:
    """Start the four services, their workers, migrations and (if none answers) a local Redis."""
    if no_auth:
        os.environ["KZ_AUTH_ENABLED"] = "false"
        get_settings.cache_clear()
    settings = get_settings()
    try:
        lock = hold_instance_lock(settings)  # held until this process ends
        check_ports_free(settings)
    except (AlreadyRunning, PortInUse) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"[bold]KernelZero[/] data in {settings.data_dir}; database {settings.sqlalchemy_url.split('@')[-1]}")
    migrate.upgrade()
    if settings.auth_enabled:
        _ensure_local_key(settings.api_key_file)
    launcher = Launcher(settings, console)

    def on_signal(signum: int, _frame: object) -> None:
        launcher.request_stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    exit_code = 0
    try:
        launcher.start(env=dict(os.environ))
        launcher.wait_until_ready()
        table = Table(title="KernelZero is up (Ctrl-C stops everything)")
        for column in ("service", "url", "docs"):
            table.add_column(column)
        for service in SERVICE_NAMES:
            url = settings.service_url(service)
            table.add_row(service, url, f"{url}/docs")
        console.print(table)
        launcher.supervise()
    except (RuntimeError, TimeoutError) as exc:
        if not launcher.stopping:
            console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
            exit_code = 1
    finally:
        console.print("stopping…")
        launcher.stop()
        lock.close()
        console.print("stopped.")
    raise typer.Exit(exit_code)


def _ensure_local_key(path: Path) -> None:
    """First start with auth on: make one key for this machine and keep it where the CLI finds it."""
    if path.exists() and auth.is_valid_key(path.read_text().strip()):
        console.print(f"API key for this machine: {path}")
        return
    _, plaintext = auth.create_api_key("local", admin=True)  # the operator's own key
    path.write_text(plaintext)
    path.chmod(0o600)
    console.print(f"created an API key for this machine in {path} (send it as 'Authorization: Bearer <key>')")


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout.")) -> None:
    """What runs, whether each service is ready, and how deep each queue is; exit 1 unless every service is ready."""
    settings = get_settings()
    state_path = run_state_path(settings)
    state = json.loads(state_path.read_text()) if state_path.exists() else {"processes": []}
    processes = [{**p, "alive": psutil.pid_exists(p["pid"])} for p in state["processes"]]
    services = {}
    for service in SERVICE_NAMES:
        try:
            response = httpx.get(f"{settings.service_url(service)}/readyz", timeout=2)
            services[service] = "ready" if response.status_code == 200 else f"not ready: {response.json().get('checks')}"
        except httpx.HTTPError:
            services[service] = "down"
    queues: dict[str, int | None] = {}
    queue_names = [PROPOSAL, GENERATION, *scoring_queues(settings.gpu_devices), TRAINING]
    if redis_answers(settings.redis_url):
        client = redis.Redis.from_url(settings.redis_url)
        queues = {name: int(client.llen(name)) for name in queue_names}
    else:
        queues = {name: None for name in queue_names}
    all_ready = all(state_text == "ready" for state_text in services.values())
    if as_json:
        print(json.dumps({"processes": processes, "services": services, "queues": queues, "ready": all_ready}))
        raise typer.Exit(0 if all_ready else 1)
    table = Table(title="services")
    for column in ("service", "url", "state"):
        table.add_column(column)
    for service, state_text in services.items():
        table.add_row(service, settings.service_url(service), state_text)
    console.print(table)
    ptable = Table(title="processes")
    for column in ("name", "pid", "alive"):
        ptable.add_column(column)
    for p in processes:
        ptable.add_row(p["name"], str(p["pid"]), "yes" if p["alive"] else "no")
    console.print(ptable)
    qtable = Table(title="queues")
    qtable.add_column("queue")
    qtable.add_column("waiting")
    for name, depth in queues.items():
        qtable.add_row(name, "redis down" if depth is None else str(depth))
    console.print(qtable)
    if not all_ready:
        raise typer.Exit(1)  # a script's `kernelzero status && ...` must not go on past a service that is down


@app.command()
def down(
    timeout: float = typer.Option(60.0, "--timeout", min=1, help="Seconds to wait for it to stop."),
) -> None:
    """Stop the `kernelzero up` that runs on this data dir (one started in the background, say): as Ctrl-C does."""
    settings = get_settings()
    try:
        stopped = stop_running_up(settings, timeout)
    except TimeoutError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"stopped kernelzero up (pid {stopped})" if stopped else f"kernelzero up is not running on {settings.data_dir}")


@apikey_app.command("create")
def apikey_create(
    name: str = typer.Argument(..., help="Who or what the key is for."),
    admin: bool = typer.Option(False, "--admin", help="May also switch the serving model (POST /v1/admin/model)."),
) -> None:
    """Create a key; it is printed once and stored only as a hash."""
    migrate.upgrade()
    key, plaintext = auth.create_api_key(name, admin=admin)
    console.print(f"id {key.id}  prefix {key.prefix}{'  admin' if key.admin else ''}")
    print(plaintext)


@apikey_app.command("list")
def apikey_list(as_json: bool = typer.Option(False, "--json", help="One JSON array on stdout, a key per element.")) -> None:
    """All keys, revoked ones marked."""
    keys = auth.list_api_keys()
    if as_json:
        fields = ("id", "name", "prefix", "admin", "created_at", "revoked_at")
        print(json.dumps([{f: getattr(key, f) for f in fields} for key in keys], default=str))
        return
    table = Table()
    for column in ("id", "name", "prefix", "admin", "created", "revoked"):
        table.add_column(column)
    for key in keys:
        table.add_row(
            key.id,
            key.name,
            key.prefix,
            "yes" if key.admin else "",
            str(key.created_at)[:19],
            str(key.revoked_at)[:19] if key.revoked_at else "",
        )
    console.print(table)


@apikey_app.command("revoke")
def apikey_revoke(key: str = typer.Argument(..., help="The key's id or prefix.")) -> None:
    """Revoke a key: requests with it get 401 from then on."""
    revoked = auth.revoke_api_key(key)
    if revoked is None:
        console.print(f"[red]no key with id or prefix {key}[/]")
        raise typer.Exit(1)
    console.print(f"revoked {revoked.id} ({revoked.name})")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply migrations."""
    migrate.upgrade(revision=revision)


@db_app.command("downgrade")
def db_downgrade(revision: str = typer.Argument(..., help="Target revision, 'base' for empty.")) -> None:
    """Revert migrations."""
    migrate.downgrade(revision=revision)


if __name__ == "__main__":
    sys.exit(app())
