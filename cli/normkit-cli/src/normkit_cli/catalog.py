"""`normkit list`, `normkit plugins`, `normkit show`: what is installed and what a spec builds."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from normkit_cli import catalog_cache
from normkit_cli.ascii_ints import ascii_int
from normkit_cli.errors import one_line_errors
from normkit_cli.text import console as _console

if TYPE_CHECKING:
    import normkit

# normkit (and so torch) is imported only when the catalog cache cannot answer (catalog_cache.py):
# `normkit --help` never loads it, `list`/`plugins`/`show` only after a plugin changed.


def _columns(table: Table, names: tuple[str, ...], rows: list[list[str]], right: tuple[str, ...] = ()) -> None:
    """Add `names` as columns. The first (the name a command takes) is as wide as its longest value, never
    broken; the others wrap between words in the room the terminal leaves, a word longer than that
    folded onto the next line: nothing is cut ("…"), at any width. Written to a file or a pipe the
    console is wide enough that every row stays on one line (normkit_cli.text.console)."""
    for i, name in enumerate(names):
        justify = "right" if name in right else "left"
        if i == 0:
            longest = max([len(name), *(len(str(row[0])) for row in rows)])
            table.add_column(name, min_width=longest, no_wrap=True, justify=justify)
        else:
            table.add_column(name, overflow="fold", justify=justify)


SHOW_DEFAULTS = (64, False, None)  # show_cmd's --channels, --tokens, --activation


def _show_key(spec: str, channels: int, tokens: bool, activation: str | None) -> str:
    return json.dumps([spec, channels, tokens, activation])


def _catalog() -> dict[str, Any]:
    """list, plugins and show, from the cache when it is current, else from the plugins themselves."""
    use_cache = catalog_cache.enabled()  # before normkit is imported below
    cached = catalog_cache.read() if use_cache else None
    return cached if cached is not None else build_catalog(write=use_cache)


def build_catalog(shows: bool = True, write: bool = True) -> dict[str, Any]:
    """list, plugins and show (every norm at the default options, unless `shows` is false: then
    `normkit show` adds each when asked) from the plugins themselves, cached when `write` and every
    plugin loaded. compare calls it when there is no current catalog (it loads the plugins anyway), so
    that the next misspelled norm is answered before torch is imported."""
    import normkit
    from normkit import plugins

    infos = plugins.plugins()
    reg = plugins.registry()
    content: dict[str, Any] = {
        "list": {"norms": normkit.available(), "items": [e.as_dict() for e in reg.of_kind("model", "dataset")]},
        "plugins": [vars(i) for i in infos],
        "show": {},
    }
    if any(i.error for i in infos) or not write:
        return content
    for entry in reg.of_kind("norm") if shows else ():
        try:
            content["show"][_show_key(entry.name, *SHOW_DEFAULTS)] = _show_data(entry.name, *SHOW_DEFAULTS)
        except Exception:  # noqa: BLE001 - a norm that needs other options is shown live
            continue
    catalog_cache.write(json.loads(json.dumps(content, default=str)))
    return content


@one_line_errors
def list_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """List norms, stages, models and datasets with aliases, plugin and summary."""
    listing = _catalog()["list"]
    norms, items = listing["norms"], listing["items"]
    if as_json:
        typer.echo(json.dumps({"norms": norms, "items": items}, indent=2, default=str))
        return
    console = _console()
    table = Table(title="Norms and stages (compose with '+')")
    rows = [[e["name"], e["kind"] + (f" = {e['expands_to']}" if e.get("expands_to") else ""),
             ", ".join(e["aliases"]), e["plugin"], e["summary"]] for e in norms]
    _columns(table, ("name", "kind", "aliases", "plugin", "summary"), rows)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for kind, title in (("model", "Models"), ("dataset", "Datasets")):
        rows = [[e["name"], ", ".join(e["aliases"]), e["plugin"], e["summary"]] for e in items if e["kind"] == kind]
        t = Table(title=title)
        _columns(t, ("name", "aliases", "plugin", "summary"), rows)
        for row in rows:
            t.add_row(*row)
        if rows:
            console.print(t)
        else:
            console.print(f"{title}: none installed (install normkit-lab from this checkout, see README)")


@one_line_errors
def plugins_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Installed plugins: distribution, version, what each registers, load time, load errors."""
    catalog = _catalog()
    infos = catalog["plugins"]
    if as_json:
        typer.echo(json.dumps(infos, indent=2))
        return
    caption = (f"load times measured {catalog['created']}, when the installed plugins were last loaded "
               f"({catalog_cache.OFF_ENV}=1 loads them now)" if "created" in catalog else None)
    table = Table(title="normkit plugins", caption=caption)
    rows = []
    for i in infos:
        status = ("[yellow]disabled (NORMKIT_DISABLED_PLUGINS)[/yellow]" if i["disabled"]
                  else f"[red]failed: {i['error']}[/red]" if i["error"] else "[green]ok[/green]")
        if i["warnings"] and not i["error"]:
            status += f" [yellow](warning: {'; '.join(i['warnings'])})[/yellow]"
        load = "-" if i["disabled"] else f"{i['load_seconds'] * 1000:.0f} ms"
        rows.append([i["name"], i["distribution"], i["version"], ", ".join(i["registered"]), load, status])
    _columns(table, ("plugin", "distribution", "version", "registers", "load", "status"), rows, right=("load",))
    for row in rows:
        table.add_row(*row)
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


def _show_data(spec: str, channels: int, tokens: bool, activation: str | None) -> dict[str, Any]:
    """What `normkit show` prints, as plain data (cacheable): a title, table rows, then lines."""
    import normkit

    parsed = normkit.parse(spec)
    layer = normkit.build(parsed, channels, channel_dim=-1 if tokens else 1, activation=activation)
    expanded = parsed.expanded()
    title = f"[bold]{parsed.text}[/bold]" + (f"  (= {expanded})" if expanded != parsed.text else "")
    if not isinstance(layer, normkit.NormLayer):
        return {"title": title, "rows": None, "lines": [
            f"ready-made module: {layer!r}", f"learnable parameters: {sum(p.numel() for p in layer.parameters())}"]}
    d = layer.describe()
    rows = [["partition (NAP)", d["partition"], f"layout {d['layout']}, {channels} channels"]]
    rows += [[f"step {i} (NOP)", name, _fmt(params)] for i, (name, params) in enumerate(d["steps"], 1)]
    rows.append(["recovery (NRR)", d["recovery"], ""])
    if d["activation"]:
        rows.append(["activation", d["activation"], _included_note(parsed, activation)])
    elif parsed.norm.entry.includes_activation:
        rows.append(["activation", "in the step", _included_note(parsed, activation)])
    if d["post_activation"]:
        name, params = d["post_activation"]
        rows.append(["post-activation", name, _fmt(params)])
    params = ", ".join(f"{k}{list(v)}" for k, v in d["parameters"].items()) or "none"
    buffers = ", ".join(f"{k}{list(v)}" for k, v in d["buffers"].items()) or "none"
    return {"title": title, "rows": rows, "lines": [f"parameters: {params}", f"buffers: {buffers}",
                                                    f"learnable parameters: {d['learnable']}"]}


@one_line_errors
def show_cmd(
    spec: Annotated[str, typer.Argument(help="A norm spec, e.g. 'gn(groups=8)+pn'.")],
    channels: Annotated[int, typer.Option("--channels", "-c", parser=ascii_int(min=1),
                                          help="Channel count to build for (normkit's limit: 2**24).")] = 64,
    tokens: Annotated[bool, typer.Option("--tokens", help="Channels-last tokens (N,*,C) instead of N,C,*.")] = False,
    activation: Annotated[str | None, typer.Option(help="Activation that follows the norm in the model.")] = None,
) -> None:
    """Show the stages of the layer a spec builds: partition, steps, recovery, activation."""
    key = _show_key(spec, channels, tokens, activation)
    catalog = _catalog()
    data = catalog["show"].get(key)
    if data is None:
        data = _show_data(spec, channels, tokens, activation)
        if "created" in catalog:  # a current catalog: remember this spec too
            catalog["show"][key] = data
            catalog_cache.write({k: catalog[k] for k in ("list", "plugins", "show")})
    console = _console()
    console.print(data["title"])
    if data["rows"] is not None:
        table = Table(show_header=True)
        for col in ("stage", "what", "settings"):
            table.add_column(col)
        for row in data["rows"]:
            table.add_row(*row)
        console.print(table)
    for line in data["lines"]:
        console.print(line)


def register(app: typer.Typer) -> None:
    app.command("list")(list_cmd)
    app.command("plugins")(plugins_cmd)
    app.command("show")(show_cmd)
