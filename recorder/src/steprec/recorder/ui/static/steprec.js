// The run browser's only script: no inline script is allowed (Content-Security-Policy), so it is all here.
// Everything recorded is put into the page with textContent, never as HTML.
"use strict";

function element(tag, attributes, text) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function treeNode(run, parentId) {
  const item = element("li", { class: "node", "data-run": run.run_id });
  if (run.below) {
    item.append(element("button", { type: "button", class: "toggle", "data-run": run.run_id, "aria-expanded": "false",
      title: `show the ${run.below} run(s) below` }, `▸ ${run.below}`));
  } else {
    item.append(element("span", { class: "leaf" }, "·"));
  }
  item.append(" ", element("a", { class: "run", href: `/runs/${encodeURIComponent(run.run_id)}` }, run.run_id));
  item.append(" ", element("span", { class: "agent" }, run.agent_name || ""));
  item.append(" ", element("span", { class: `outcome ${run.outcome}` }, run.outcome));
  if (run.forked_from_run_id === parentId) {
    item.append(" ", element("span", { class: "tag" }, `fork of #${run.forked_from_snapshot_index}`));
  }
  item.append(" ", element("a", { class: "reroot", href: `/runs/${encodeURIComponent(run.run_id)}/tree`,
    title: "this run's own tree" }, "⤢"));
  return item;
}

async function loadLevel(runId, offset, list) {
  const response = await fetch(`/api/runs/${encodeURIComponent(runId)}/below?offset=${offset}`,
    { credentials: "same-origin", headers: { accept: "application/json" } });
  if (!response.ok) {
    list.append(element("li", { class: "error" }, `could not load: ${response.status}`));
    return;
  }
  const level = await response.json();
  for (const run of level.runs) list.append(treeNode(run, runId));
  if (level.next_offset !== null) {
    const more = element("li", {});
    more.append(element("button", { type: "button", class: "more", "data-run": runId,
      "data-offset": String(level.next_offset) }, "more…"));
    list.append(more);
  }
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.toggle, button.more");
  if (!button) return;
  const runId = button.dataset.run;
  if (button.classList.contains("more")) {
    const list = button.closest("ul");
    button.parentElement.remove();
    await loadLevel(runId, Number(button.dataset.offset), list);
    return;
  }
  const item = button.closest("li");
  let list = item.querySelector(":scope > ul.level");
  const opening = button.getAttribute("aria-expanded") !== "true";
  button.setAttribute("aria-expanded", String(opening));
  button.textContent = button.textContent.replace(opening ? "▸" : "▾", opening ? "▾" : "▸");
  if (list) {
    list.hidden = !opening;
    return;
  }
  list = element("ul", { class: "level", "data-parent": runId });
  item.append(list);
  await loadLevel(runId, 0, list);
});

document.addEventListener("change", (event) => {
  if (event.target.matches("select[data-autosubmit]")) event.target.form.submit();
});
