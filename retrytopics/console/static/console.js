// retrytopics console: live pipeline numbers (polling /api/pipeline), a Spark replay's progress (polling
// /api/jobs/<id>) and the "check all" box of the DLQ page.
// Every value from the server is set with textContent: record content is never parsed as HTML.
"use strict";

function cell(text, numeric) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (numeric) td.className = "n";
  return td;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    tr.append(...cells);
    return tr;
  }));
}

function rate(value) {
  return value === null ? "-" : (value * 100).toFixed(1) + "%";
}

async function refresh() {
  let data;
  try {
    const response = await fetch("/api/pipeline", {cache: "no-store", credentials: "same-origin"});
    if (!response.ok) return;
    data = await response.json();
  } catch (_) {
    return; // the console or the broker is away: keep the last numbers, try again later
  }
  document.getElementById("updated").textContent = data.at;
  document.getElementById("counted").textContent = data.counted.records;
  document.getElementById("counted-of").textContent = data.counted.of;
  fill(document.querySelector("#stages tbody"), data.stages.map((s) => {
    const overdue = cell(s.overdue, true);
    if (s.overdue) overdue.classList.add("bad");
    return [cell(s.kind), cell(s.topic), cell(s.records, true), cell(s.lag, true), cell(s.waiting, true), overdue];
  }));
  fill(document.querySelector("#by-reason tbody"), data.dlq_by_reason.map(([k, n]) => [cell(k), cell(n, true)]));
  fill(document.querySelector("#by-type tbody"), data.dlq_by_type.map(([k, n]) => [cell(k), cell(n, true)]));
  fill(document.querySelector("#recovery tbody"), data.recovery.map((r) =>
    [cell(r.topic), cell(r.handled, true), cell(r.recovered, true), cell(rate(r.rate), true)]));
  const guards = document.querySelector("#guards tbody");
  if (guards && data.flood_guard) {
    const command = data.flood_guard.last_command;
    document.getElementById("guard-command").textContent = command
      ? "last command: " + command.action + " by " + command.by + ": " + command.reason
      : "no command given by hand";
    fill(guards, data.flood_guard.processes.map((p) => {
      const state = cell(p.state + (p.by_hand ? " (by hand)" : ""));
      if (p.state !== "closed") state.classList.add("bad");
      return [cell(p.process), state, cell(p.reason), cell(p.openings, true), cell(p.probes, true),
        cell(p.calls_refused, true), cell(p.deferred, true), cell((p.time_open_ms / 1000).toFixed(1), true),
        cell(Math.round(p.reported_ms_ago / 1000), true)];
    }));
  }
  document.getElementById("chart").src = "/chart.svg?at=" + Date.now();
}

async function follow(job) {
  // a Spark replay's page: its progress line, and a reload when the job's state changes (done: its counts)
  try {
    const response = await fetch("/api/jobs/" + encodeURIComponent(job.dataset.job), {cache: "no-store"});
    if (!response.ok) return;
    const data = await response.json();
    document.getElementById("job-progress").textContent = data.progress;
    if (data.state !== job.dataset.state) window.location.reload();
  } catch (_) {
    // the console is away: try again
  }
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.getElementById("stages")) setInterval(refresh, 2000);
  const job = document.getElementById("job");
  if (job && (job.dataset.state === "starting" || job.dataset.state === "running")) {
    setInterval(() => follow(job), 1000);
  }
  const all = document.getElementById("check-all");
  if (all) all.addEventListener("change", () => {
    for (const box of document.querySelectorAll("input.pick")) box.checked = all.checked;
  });
});
