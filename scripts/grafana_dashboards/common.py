"""What every dashboard shares: label selectors, variables, panel helpers and assembly.

The helpers wrap grafana-foundation-sdk's typed builders with this project's defaults
(Prometheus data source variable, legend and tooltip, colours), so a panel is one call:

    ts("Title", (promql, legend), (promql, legend), unit="watt", description="...")

Each `(promql, legend)` pair becomes a Prometheus query (refId A, B, ...); an empty
legend lets Grafana name the series. `w` and `h` size the panel on the 24-column grid;
panels flow left to right, and a line must fill its 24 columns or end at a row.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge as bargauge_panel
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, statetimeline, timeseries
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import table as table_panel
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label selectors shared by the queries. The `cluster` label is added to every target
# by the scrape config (see dashboards/README.md); with "All" the regex is `.*`, which
# also matches series without the label.
C = 'cluster=~"$cluster"'
N = f'{C}, instance=~"$instance"'
G = f'{N}, gpu=~"$gpu"'
JOIN = "on(cluster, instance, gpu, uuid) group_left()"
RI = "$__rate_interval"
NO_ALERTS = 'or on() label_replace(vector(0), "severity", "none", "", "")'

Query = tuple[str, str]  # (PromQL, legend)
Item = Builder  # what a dashboard's panel list holds
TAG = "cluster-telemetry-exporter"


# --- thresholds and value mappings ----------------------------------------------------

def steps(*above: tuple[float, str], base: str = "green") -> list[dm.Threshold]:
    """Threshold steps: `base` colour, then (value, colour) from that value up."""
    return [dm.Threshold(value=None, color=base),
            *(dm.Threshold(value=value, color=color) for value, color in above)]


def value_map(*entries: tuple[str, str, str]) -> list[dm.ValueMapping]:
    """One value mapping from (value, text, colour) entries, in display order."""
    return [dm.ValueMap(options={value: dm.ValueMappingResult(text=text, color=color, index=i)
                                 for i, (value, text, color) in enumerate(entries)})]


RED_ABOVE_0 = steps((1, "red"))
ORANGE_ABOVE_0 = steps((1, "orange"))
UP_DOWN = value_map(("0", "down", "red"), ("1", "up", "green"))
ON_OFF = value_map(("0", "no", "transparent"), ("1", "yes", "orange"))


# --- template variables ---------------------------------------------------------------

def query_var(name: str, label: str, query: str, *, include_all: bool = True,
              multi: bool = True) -> db.QueryVariable:
    var = (db.QueryVariable(name).label(label).datasource(DS)
           .query({"query": query, "refId": f"{name}-values"})
           .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
           .sort(dm.VariableSort.NUMERICAL_ASC if name == "gpu"
                 else dm.VariableSort.ALPHABETICAL_ASC)
           .include_all(include_all).multi(multi))
    return var.all_value(".*") if include_all else var


def variables(*, single_instance: bool = False,
              extra: tuple[db.QueryVariable, ...] = ()) -> list[Builder]:
    """Data source, Cluster, Job, Node and GPU (Node single-valued on a one-node board)."""
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        query_var("cluster", "Cluster", "label_values(gpu_up, cluster)"),
        query_var("hpc_job", "Job", f"label_values(gpu_hpc_job_info{{{C}}}, hpc_job)"),
        query_var("instance", "Node", f"label_values(gpu_up{{{C}}}, instance)",
                  include_all=not single_instance, multi=not single_instance),
        query_var("gpu", "GPU", f"label_values(gpu_up{{{N}}}, gpu)"),
        *extra,
    ]


# --- panels ---------------------------------------------------------------------------

def targets(queries: tuple[Query, ...], *, instant: bool = False,
            table: bool = False) -> list[prometheus.Dataquery]:
    out = []
    for i, (expr, legend) in enumerate(queries):
        q = (prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(expr).datasource(DS)
             .legend_format(legend or "__auto").editor_mode(pm.QueryEditorMode.CODE))
        q = q.instant() if instant else q.range()
        out.append(q.format(pm.PromQueryFormat.TABLE) if table else q)
    return out


def _base(panel, title: str, queries: tuple[Query, ...], *, w: int, h: int, unit: str,
          description: str, color: dm.FieldColorModeId = dm.FieldColorModeId.THRESHOLDS,
          thresholds: list[dm.Threshold] | None = None,
          mappings: list[dm.ValueMapping] | None = None, minimum: float | None = None,
          maximum: float | None = None, instant: bool = False, table: bool = False):
    """Settings every panel shares: title, data source, queries, size, unit, colours."""
    panel = (panel.title(title).datasource(DS).span(w).height(h).unit(unit)
             .targets(targets(queries, instant=instant, table=table))
             .color_scheme(db.FieldColor().mode(color))
             .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
                         .steps(thresholds or steps())))
    if description:
        panel = panel.description(description)
    if mappings:
        panel = panel.mappings(mappings)
    if minimum is not None:
        panel = panel.min(minimum)
    if maximum is not None:
        panel = panel.max(maximum)
    return panel


def ts(title: str, *queries: Query, unit: str = "short", description: str = "",
       bars: bool = False, stack: bool = False, w: int = 12, h: int = 8,
       **kw) -> timeseries.Panel:
    """Time series; `bars` draws bars, `stack` stacks the series."""
    panel = (timeseries.Panel()
             .draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
             .line_width(1).fill_opacity(60 if bars else 10)
             .show_points(cm.VisibilityMode.NEVER).span_nulls(False)
             .stacking(cb.StackingConfig().group("A").mode(
                 cm.StackingMode.NORMAL if stack else cm.StackingMode.NONE))
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                     .placement(cm.LegendPlacement.RIGHT).show_legend(True)
                     .calcs(["lastNotNull", "max"]))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.DESCENDING)))
    return _base(panel, title, queries, w=w, h=h, unit=unit, description=description,
                 color=dm.FieldColorModeId.PALETTE_CLASSIC, **kw)


def _last_value() -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def stat(title: str, *queries: Query, unit: str = "short", description: str = "",
         w: int = 4, h: int = 4, **kw) -> stat_panel.Panel:
    """Big number(s), last value, background coloured by the thresholds."""
    panel = (stat_panel.Panel().reduce_options(_last_value())
             .color_mode(cm.BigValueColorMode.BACKGROUND)
             .graph_mode(cm.BigValueGraphMode.AREA)
             .justify_mode(cm.BigValueJustifyMode.AUTO)
             .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
             .orientation(cm.VizOrientation.AUTO))
    return _base(panel, title, queries, w=w, h=h, unit=unit, description=description, **kw)


def table(title: str, *queries: Query, unit: str = "short", description: str = "",
          merge: bool = False, hide: tuple[str, ...] = ("Time", "__name__", "job"),
          w: int = 12, h: int = 8, **kw) -> table_panel.Panel:
    """Instant queries as a table; `merge` joins the queries' rows, `hide` drops columns."""
    panel = table_panel.Panel().show_header(True).cell_height(cm.TableCellHeight.SM)
    if merge:
        panel = panel.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    panel = panel.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
        "excludeByName": dict.fromkeys(hide, True), "indexByName": {}, "renameByName": {}}))
    return _base(panel, title, queries, w=w, h=h, unit=unit, description=description,
                 instant=True, table=True, **kw)


def timeline(title: str, *queries: Query, description: str = "", w: int = 12, h: int = 8,
             **kw) -> statetimeline.Panel:
    """State over time; pass `mappings` to name and colour the states."""
    panel = (statetimeline.Panel().show_value(cm.VisibilityMode.AUTO).merge_values(True)
             .row_height(0.9).align_value("left").line_width(0).fill_opacity(80)
             .legend(cb.VizLegendOptions().show_legend(True)
                     .display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.SINGLE)
                      .sort(cm.SortOrder.NONE)))
    return _base(panel, title, queries, w=w, h=h, unit="short", description=description, **kw)


def bargauge(title: str, *queries: Query, unit: str = "short", description: str = "",
             w: int = 12, h: int = 8, **kw) -> bargauge_panel.Panel:
    """Horizontal gradient bars of instant values."""
    panel = (bargauge_panel.Panel().reduce_options(_last_value())
             .orientation(cm.VizOrientation.HORIZONTAL)
             .display_mode(cm.BarGaugeDisplayMode.GRADIENT).show_unfilled(True)
             .value_mode(cm.BarGaugeValueMode.COLOR)
             .name_placement(cm.BarGaugeNamePlacement.AUTO)
             .sizing(cm.BarGaugeSizing.AUTO).min_viz_width(8).min_viz_height(16))
    return _base(panel, title, queries, w=w, h=h, unit=unit, description=description,
                 instant=True, **kw)


def row(title: str) -> db.Row:
    return db.Row(title).collapsed(False)


# --- assembly -------------------------------------------------------------------------

def dashboard(uid: str, title: str, description: str, panels: list[Item],
              templating: list[Builder]) -> dm.Dashboard:
    """One dashboard: shared settings, links to the others, the variables and panels.

    Panel ids count from 1 in list order; the SDK places each panel after the previous
    one and starts a new line when 24 columns are full or at a row.
    """
    board = (db.Dashboard(title).uid(uid).description(description).tags([TAG, "gpu"])
             .editable().tooltip(dm.DashboardCursorSync.CROSSHAIR).time("now-1h", "now")
             .refresh("30s").timezone("").live_now(False).week_start("").version(1)
             .link(db.DashboardLink("GPU cluster").type(dm.DashboardLinkType.DASHBOARDS)
                   .tags([TAG]).as_dropdown(True).include_vars(True).keep_time(True)
                   .icon("external link").target_blank(False))
             .variables(templating))
    x = 0
    for pid, item in enumerate(panels, start=1):
        item.id(pid)
        if isinstance(item, db.Row):
            board.with_row(item)
            x = 0
            continue
        panel = item.build()
        w = (panel.grid_pos or dm.GridPos()).w  # the SDK's default size when none is set
        if x + w > 24:
            raise ValueError(f"{uid}: panel {pid} {panel.title!r} (w={w}) does not fit "
                             f"after {x} columns: fill the line to 24 or start a row")
        x = (x + w) % 24
        board.with_panel(item)
    return board.build()

# DCGM 4.x's PCIe replay limit, as the GpuPcieReplaysHigh alert and the health check apply it
PCIE_REPLAYS_LIMIT = ("DCGM 4.x warns above ceil(per-lane rate x lanes) a minute: 16 on Gen4 "
                      "x16, 31 on Gen5 x16 (the GpuPcieReplaysHigh alert).")
