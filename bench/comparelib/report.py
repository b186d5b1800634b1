"""What `compare` gathered, as one table on stdout, a CSV file and gnuplot PNG curves."""
import csv
import os
import shutil
import statistics
from collections import defaultdict

from . import hosts_section
from . import peers_section
from . import torch_hosts_section
from .runner import run

CSV_FIELDS = ["timestamp", "round", "test", "transport", "ranks", "size", "metric", "value",
              "unit", "floor_before_ns", "floor_after_ns", "state"]

PT2PT = [("latency", "latency_us", "Latency (us), lower is better",
          "ratio = shmdist / other: below 1 means shmdist is faster; "
          "x floor = shmdist latency in cache-line hand-offs"),
         ("bw", "bandwidth_mbs", "Bandwidth (MB/s, 10^6 B), higher is better",
          "ratio = shmdist / other: above 1 means shmdist is faster; "
          "/memcpy = fraction of one core's memcpy rate"),
         ("bibw", "bandwidth_mbs", "Bi-directional bandwidth (MB/s), higher is better",
          "ratio = shmdist / other; /memcpy = fraction of one core's memcpy rate")]

COLLECTIVE_TESTS = ["allreduce", "bcast", "reduce", "allgather", "reduce_scatter", "alltoall"]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, width=10, digits=2):
    if v is None:
        return "-".rjust(width)
    if abs(v) >= 1e6:
        return ("%.3g" % v).rjust(width)
    if abs(v) >= 1000:
        return ("%.0f" % v).rjust(width)
    if v != 0 and abs(v) < 0.01:
        return ("%.1e" % v).rjust(width)
    return ("%.*f" % (digits, v)).rjust(width)


class Report:
    def __init__(self, records, floors, failures, notes, meta):
        self.records = records  # dicts with CSV_FIELDS
        self.floors = floors    # {"start": {probe: (median,min,max,unit)}, "end": {...}}
        self.failures = failures
        self.notes = notes
        self.meta = meta

    # ---- aggregation --------------------------------------------------------------------

    def _matching(self, test, transport, metric, size, ranks):
        return [r for r in self.records
                if r["test"] == test and r["transport"] == transport and r["metric"] == metric
                and r["size"] == size and (ranks is None or r["ranks"] == ranks)]

    def value(self, test, transport, metric, size, ranks=None):
        """Median over the fast-state runs; over all runs only when none ran in the fast state
        (state() then says "slow")."""
        rows = self._matching(test, transport, metric, size, ranks)
        fast = [r for r in rows if r.get("state") == "fast"]
        return median([r["value"] for r in (fast or rows)])

    def state(self, test, transports, metric, size, ranks=None):
        """"fast" when every transport's figure for this row came from fast-state runs."""
        for t in transports:
            rows = self._matching(test, t, metric, size, ranks)
            if rows and not any(r.get("state") == "fast" for r in rows):
                return "slow"
        return "fast"

    def floor_near(self, test, transport, size):
        """Cache-line one-way ns probed around the runs that produced this figure."""
        vals = []
        for r in self.records:
            if r["test"] == test and r["transport"] == transport and r["size"] == size:
                around = [v for v in (r["floor_before_ns"], r["floor_after_ns"]) if v is not None]
                if around:
                    vals.append(sum(around) / len(around))
        return median(vals)

    def transports(self, test):
        seen = []
        for r in self.records:
            if r["test"] == test and r["transport"] not in seen:
                seen.append(r["transport"])
        return seen

    def sizes(self, test, metric):
        return sorted({r["size"] for r in self.records if r["test"] == test
                       and r["metric"] == metric})

    def memcpy_gbps(self, size):
        probe = "memcpy_64KiB" if size <= 64 << 10 else "memcpy_1MiB" if size <= 1 << 20 \
            else "memcpy_4MiB"
        return median([f[probe][0] for f in self.floors.values() if probe in f])

    def _collectives_text(self):
        """Average us per call; ratio = shmdist / other (below 1: shmdist is faster)."""
        out = []
        for test in COLLECTIVE_TESTS:
            ranks_seen = sorted({r["ranks"] for r in self.records if r["test"] == test})
            for ranks in ranks_seen:
                others = [t for t in self.transports(test) if t != "shmdist"]
                sizes = sorted({r["size"] for r in self.records
                                if r["test"] == test and r["ranks"] == ranks})
                if not sizes:
                    continue
                out.append("")
                out.append("%s, %d ranks: average us per call (ratio = shmdist / other, below 1 "
                           "means shmdist is faster)" % (test, ranks))
                out.append("%10s%10s" % ("size", "shmdist") +
                           "".join("%10s%8s" % (o, "ratio") for o in others) + "   state")
                for size in sizes:
                    mine = self.value(test, "shmdist", "latency_us", size, ranks)
                    line = "%10d%s" % (size, fmt(mine))
                    for o in others:
                        theirs = self.value(test, o, "latency_us", size, ranks)
                        ratio = mine / theirs if mine and theirs else None
                        line += fmt(theirs) + fmt(ratio, 8)
                    state = self.state(test, ["shmdist"] + others, "latency_us", size, ranks)
                    out.append(line + "   " + state)
        return out

    def drift_probes(self):
        return [r["value"] for r in self.records if r["test"] == "floor-drift"]

    # ---- text ---------------------------------------------------------------------------

    def text(self):
        out = []
        m = self.meta
        out.append("shmdist compare  %s  host %s (%s CPUs)  mode %s  rounds %d" %
                   (m["started"], m["host"], m["cpus"], m["mode"], m["rounds"]))
        out.append("load average at start %s, at end %s; 2-rank runs bound to cores: %s; build %s"
                   % (m["load_start"], m["load_end"], "yes" if m["bind"] == "core" else "no",
                      m["build_dir"]))
        out.extend(self._floor_text())
        for test, metric, title, legend in PT2PT:
            out.extend(self._pt2pt_text(test, metric, title, legend))
        out.extend(self._anysource_text())
        out.extend(self._collectives_text())
        out.extend(self._idle_text())
        out.extend(hosts_section.text(self))
        out.extend(torch_hosts_section.text(self))
        out.extend(peers_section.text(self))
        if self.notes or self.failures:
            out.append("")
            out.append("Skipped or failed:")
            out.extend("  " + n for n in self.notes)
            out.extend("  %s: %s" % (what, why) for what, why in self.failures)
        return "\n".join(out)

    def _floor_text(self):
        out = ["", "Floor (shmdist-floor, start -> end of the session; median of runs):"]
        names = [("cacheline_one_way", "cache-line hand-off, one way"),
                 ("samecore_yield_one_way", "same core, sched_yield, one way"),
                 ("futex_wake_one_way", "futex wake-up, one way"),
                 ("memcpy_64KiB", "memcpy 64 KiB"), ("memcpy_1MiB", "memcpy 1 MiB"),
                 ("memcpy_4MiB", "memcpy 4 MiB")]
        for key, label in names:
            vals = [self.floors[w].get(key) for w in ("start", "end")]
            if not any(vals):
                continue
            unit = next(v[3] for v in vals if v)
            out.append("  %-34s %s -> %s %s" % (label, fmt(vals[0] and vals[0][0], 9),
                                                 fmt(vals[1] and vals[1][0], 9), unit))
        if self.meta.get("floor_min"):
            out.append("  fast-state gate: a run counts when the probes around it read at most "
                       "%.1fx the session's lowest (%.1f ns); %d run(s) repeated for leaving the "
                       "band; figures are medians of fast-state runs, rows marked 'slow' had "
                       "none" % (self.meta["gate_band"], self.meta["floor_min"],
                                 self.meta["gate_repeats"]))
        drift = self.drift_probes()
        if drift:
            lo, hi = min(drift), max(drift)
            out.append("  drift: cache-line one-way probed around every run (%d probes): "
                       "min %.1f, median %.1f, max %.1f ns (max/min %.2fx)%s" %
                       (len(drift), lo, statistics.median(drift), hi, hi / lo if lo else 0,
                        "  << the machine moved: compare ratios, not absolutes"
                        if lo and hi / lo > 1.5 else ""))
        return out

    def _pt2pt_text(self, test, metric, title, legend):
        transports = self.transports(test)
        if not transports:
            return []
        others = [t for t in transports if t != "shmdist"]
        is_latency = test == "latency"
        head = ["Size".ljust(8)]
        if is_latency:
            head.append("floor ns".rjust(10))
        head += [t.rjust(11) for t in transports]
        head += [("/" + t).rjust(13) for t in others]
        head.append(("x floor" if is_latency else "/memcpy").rjust(9))
        head.append("state".rjust(7))
        out = ["", "%s  [%s]" % (title, legend), "".join(head)]
        for size in self.sizes(test, metric):
            vals = {t: self.value(test, t, metric, size) for t in transports}
            shm = vals.get("shmdist")
            line = [str(size).ljust(8)]
            floor_ns = self.floor_near(test, "shmdist", size)
            if is_latency:
                line.append(fmt(floor_ns))
            line += [fmt(vals[t], 11) for t in transports]
            line += [fmt(shm / vals[t] if shm and vals[t] else None, 13, 3) for t in others]
            if is_latency:
                rel = shm * 1000.0 / floor_ns if shm and floor_ns else None
            else:
                gbps = self.memcpy_gbps(size)
                rel = shm / (gbps * 1000.0) if shm and gbps else None
            line.append(fmt(rel, 9, 2 if is_latency else 3))
            line.append(self.state(test, transports, metric, size).rjust(7))
            out.append("".join(line))
        return out

    def _anysource_text(self):
        runs = sorted({(r["transport"], r["ranks"]) for r in self.records
                       if r["test"] == "anysource"}, key=lambda x: (x[1], x[0]))
        if not runs:
            return []
        out = ["", "Any-source: rank 0 receives with ANY_SOURCE (latency: 1 active sender, the "
               "others blocked; rate: all senders streaming). ratio = shmdist / other"]
        header = "Ranks".ljust(6) + "Size".ljust(7)
        cols = sorted({t for t, _ in runs}, key=lambda t: (t != "shmdist", t))
        header += "".join(("lat " + t).rjust(16) for t in cols)
        header += "".join(("msg/s " + t).rjust(17) for t in cols if t != "gloo")
        others = [t for t in cols if t != "shmdist"]
        header += "".join(("lat /" + t).rjust(16) for t in others)
        header += "".join(("rate /" + t).rjust(17) for t in others if t != "gloo")
        out.append(header)
        for ranks in sorted({n for _, n in runs}):
            for size in self.sizes("anysource", "latency_us"):
                lat = {t: self.value("anysource", t, "latency_us", size, ranks) for t in cols}
                rate = {t: self.value("anysource", t, "msgs_per_s", size, ranks) for t in cols}
                if not any(lat.values()):
                    continue
                line = str(ranks).ljust(6) + str(size).ljust(7)
                line += "".join(fmt(lat[t], 16) for t in cols)
                line += "".join(fmt(rate[t], 17, 0) for t in cols if t != "gloo")
                s_lat, s_rate = lat.get("shmdist"), rate.get("shmdist")
                line += "".join(fmt(s_lat / lat[t] if s_lat and lat[t] else None, 16, 3)
                                for t in others)
                line += "".join(fmt(s_rate / rate[t] if s_rate and rate[t] else None, 17, 3)
                                for t in others if t != "gloo")
                out.append(line)
        return out

    def _idle_text(self):
        runs = sorted({(r["transport"], r["ranks"]) for r in self.records if r["test"] == "idle"},
                      key=lambda x: (x[1], x[0]))
        if not runs:
            return []
        out = ["", "Idle: CPU of a rank blocked in recv after its spin phase (%% of one core, "
               "blocked %.2f s; mean over the waiting ranks / worst rank)" % self.meta["idle_s"],
               "Transport".ljust(18) + "Ranks".rjust(6) + "named src".rjust(12) +
               "worst".rjust(9) + "ANY_SOURCE".rjust(12) + "worst".rjust(9) +
               "sleeps/s".rjust(10)]
        for t, n in runs:
            v = lambda metric: self.value("idle", t, metric, 0, n)  # noqa: E731
            out.append(t.ljust(18) + str(n).rjust(6) + fmt(v("cpu_pct_named"), 12) +
                       fmt(v("cpu_pct_named_max"), 9) + fmt(v("cpu_pct_any"), 12) +
                       fmt(v("cpu_pct_any_max"), 9) + fmt(v("sleeps_per_s"), 10, 1))
        return out

    # ---- files --------------------------------------------------------------------------

    def write_csv(self, path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for r in self.records:
                w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})

    def plot(self, stem, timeout=60):
        """Writes <stem>-latency.png and <stem>-bandwidth.png; returns (paths, message)."""
        gnuplot = shutil.which("gnuplot")
        if not gnuplot:
            return [], "plots skipped: gnuplot is not installed (apt-get install gnuplot-nox)"
        term = "pngcairo size 1000,650 font ',10'"
        if "pngcairo" not in run([gnuplot, "-e", "set terminal"], timeout).stdout:
            term = "png size 1000,650"
        files = []
        lat_dat = self._write_dat(stem + "-latency.dat", "latency", "latency_us", min_size=1)
        bw_dat = self._write_dat(stem + "-bw.dat", "bw", "bandwidth_mbs")
        bibw_dat = self._write_dat(stem + "-bibw.dat", "bibw", "bandwidth_mbs")
        script = ["set terminal %s" % term, "set datafile missing '-'", "set key top left",
                  "set logscale x 2", "set format x '%.0b%BB'", "set grid",
                  "set xlabel 'message size (bytes)'"]
        if lat_dat:
            path, cols = lat_dat
            files.append(stem + "-latency.png")
            script += ["set output '%s'" % files[-1], "set logscale y",
                       "set ylabel 'latency (us, half round trip)'",
                       "set title 'Ping-pong latency (%s)'" % self.meta["started"],
                       "plot " + ", ".join("'%s' using 1:%d with linespoints title '%s'"
                                           % (path, i + 2, c) for i, c in enumerate(cols))]
        if bw_dat or bibw_dat:
            files.append(stem + "-bandwidth.png")
            script += ["set terminal %s" % term.replace("1000,650", "1400,600"),
                       "set output '%s'" % files[-1], "set logscale y",
                       "set ylabel 'bandwidth (MB/s, 10^6 B)'", "set multiplot layout 1,2"]
            for dat, name in ((bw_dat, "bw: window of 64 isends, then an ack"),
                              (bibw_dat, "bibw: both directions, window of 64")):
                if not dat:
                    continue
                path, cols = dat
                script += ["set title '%s (%s)'" % (name, self.meta["started"]),
                           "plot " + ", ".join("'%s' using 1:%d with linespoints linecolor %d "
                                               "title '%s'" % (path, i + 2, i + 1, c)
                                               for i, c in enumerate(cols))]
            script.append("unset multiplot")
        if not files:
            return [], "plots skipped: no point-to-point data"
        res = run([gnuplot, "-e", "; ".join(script)], timeout)
        if not res.ok:
            return [], "plots failed: gnuplot %s" % res.reason
        return files, ""

    def _write_dat(self, path, test, metric, min_size=0):
        cols = self.transports(test)
        sizes = [s for s in self.sizes(test, metric) if s >= min_size]
        if not cols or not sizes:
            return None
        by = defaultdict(dict)
        for t in cols:
            for s in sizes:
                by[s][t] = self.value(test, t, metric, s)
        with open(path, "w") as f:
            f.write("# size " + " ".join(cols) + "\n")
            for s in sizes:
                f.write("%d %s\n" % (s, " ".join("-" if by[s][t] is None else "%.6g" % by[s][t]
                                                 for t in cols)))
        return path, cols
