"""`normkit list`, `normkit plugins`, `normkit show`: what is installed and what a spec builds."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from normkit_cli.errors import one_line_errors

if TYPE_CHECKING:
    import normkit

# normkit (and so torch) is imported inside each command: `normkit --help` must not load it.


def _console() -> Console:
    return Console(soft_wrap=False, width=None)


@one_line_errors
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List norms, stages, models and datasets with aliases, plugin and summary."""
    import normkit
    from normkit import plugins

    reg = plugins.registry()
    norms = normkit.available()
    items = [e.as_dict() for e in reg.of_kind("model", "dataset")]
    if as_json:
        typer.echo(json.dumps({"norms": norms, "items": items}, indent=2, default=str))
        return
    console = _console()
    table = Table(title="Norms and stages (compose with '+')")
    for col in ("name", "kind", "aliases", "plugin", "summary"):
        table.add_column(col)
    for e in norms:
        kind = e["kind"] + (f" = {e['expands_to']}" if e.get("expands_to") else "")
        table.add_row(e["name"], kind, ", ".join(e["aliases"]), e["plugin"], e["summary"])
    console.print(table)
    for kind, title in (("model", "Models"), ("dataset", "Datasets")):
        rows = [e for e in items if e["kind"] == kind]
        t = Table(title=title)
        for col in ("name", "aliases", "plugin", "summary"):
            t.add_column(col)
        for e in rows:
            t.add_row(e["name"], ", ".join(e["aliases"]), e["plugin"], e["summary"])
        if rows:
            console.print(t)
        else:
            console.print(f"{title}: none installed (pip install normkit-lab)")


@one_line_errors
def plugins_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Installed plugins: distribution, version, what each registers, load errors."""
    from normkit import plugins

    infos = plugins.plugins()
    if as_json:
        typer.echo(json.dumps([vars(i) for i in infos], indent=2))
        return
    table = Table(title="normkit plugins")
    for col in ("plugin", "distribution", "version", "registers", "load", "status"):
        table.add_column(col, justify="right" if col == "load" else "left")
    for i in infos:
        status = ("[yellow]disabled (NORMKIT_DISABLED_PLUGINS)[/yellow]" if i.disabled
                  else f"[red]failed: {i.error}[/red]" if i.error else "[green]ok[/green]")
        if i.warnings and not i.error:
            status += f" [yellow](warning: {'; '.join(i.warnings)})[/yellow]"
        load = "-" if i.disabled else f"{i.load_seconds * 1000:.0f} ms"
        table.add_row(i.name, i.distribution, i.version, ", ".join(i.registered), load, status)
    _console().print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)


def _included_note(parsed: normkit.Spec, activation: str | None) -> str:
    """For norms that include their nonlinearity: say the model's activation after it is dropped."""
    if not parsed.norm.entry.includes_activation:
        return ""
    dropped = f"--activation {activation} dropped" if activation else "a following activation is dropped"
    return f"included in {parsed.norm.name}; {dropped} (convert, normkit-lab models)"


@one_line_errors
def show_cmd(
    spec: Annotated[str, typer.Argument(help="A norm spec, e.g. 'gn(groups=8)+pn'.")],
    channels: Annotated[int, typer.Option("--channels", "-c", min=1,
                                          help="Channel count to build for (normkit's limit: 2**24).")] = 64,
    tokens: Annotated[bool, typer.Option("--tokens", help="Channels-last tokens (N,*,C) instead of N,C,*.")] = False,
    activation: Annotated[str | None, typer.Option(help="Activation that follows the norm in the model.")] = None,
) -> None:
    """Show the stages of the layer a spec builds: partition, steps, recovery, activation."""
    import normkit

    parsed = normkit.parse(spec)
    layer = normkit.build(parsed, channels, channel_dim=-1 if tokens else 1, activation=activation)
    console = _console()
    expanded = parsed.expanded()
    console.print(f"[bold]{parsed.text}[/bold]" + (f"  (= {expanded})" if expanded != parsed.text else ""))
    if not isinstance(layer, normkit.NormLayer):
        console.print(f"ready-made module: {layer!r}")
        console.print(f"learnable parameters: {sum(p.numel() for p in layer.parameters())}")
        return
    d = layer.describe()
    table = Table(show_header=True)
    table.add_column("stage")
    table.add_column("what")
    table.add_column("settings")
    table.add_row("partition (NAP)", d["partition"], f"layout {d['layout']}, {channels} channels")
    for i, (name, params) in enumerate(d["steps"], 1):
        table.add_row(f"step {i} (NOP)", name, _fmt(params))
    table.add_row("recovery (NRR)", d["recovery"], "")
    if d["activation"]:
        table.add_row("activation", d["activation"], _included_note(parsed, activation))
    elif parsed.norm.entry.includes_activation:
        table.add_row("activation", "in the step", _included_note(parsed, activation))
    if d["post_activation"]:
        name, params = d["post_activation"]
        table.add_row("post-activation", name, _fmt(params))
    console.print(table)
    params = ", ".join(f"{k}{list(v)}" for k, v in d["parameters"].items()) or "none"
    buffers = ", ".join(f"{k}{list(v)}" for k, v in d["buffers"].items()) or "none"
    console.print(f"parameters: {params}")
    console.print(f"buffers: {buffers}")
    console.print(f"learnable parameters: {d['learnable']}")


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
    app.command("plugins")(plugins_cmd)
    app.command("show")(show_cmd)
