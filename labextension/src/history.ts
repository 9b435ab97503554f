// The History side panel: the current notebook's session, its versions newest first (the cell's
// prompt number, as the notebook shows it, and first line, when, then size, what it changed and
// the version number), and a click on one checks it out, as `%llfabric checkout N` does. Only a
// cell that changed the session's state makes a version. A checkout of version 0 is a restart
// (Restart Kernel empties the session), after which prompt numbers start again at 1. Version 0,
// the empty state, is the last entry.
import { historyIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';
import { IHistory, IVersion, Link } from './link';

const STYLE = `
.llfabric-History { overflow-y: auto; padding: 4px 0; font-size: var(--jp-ui-font-size1);
  color: var(--jp-ui-font-color1); background: var(--jp-layout-color1); }
.llfabric-History-header { padding: 4px 12px 8px; font-weight: 600;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color2); }
.llfabric-History-note { padding: 8px 12px; color: var(--jp-ui-font-color2); }
.llfabric-History-list { list-style: none; margin: 0; padding: 0; }
.llfabric-History-version { padding: 6px 12px; cursor: pointer;
  border-bottom: var(--jp-border-width) solid var(--jp-border-color3); }
.llfabric-History-version:hover { background: var(--jp-layout-color2); }
.llfabric-History-version.llfabric-mod-head { border-left: 3px solid var(--jp-brand-color1);
  cursor: default; }
.llfabric-History-cell { display: flex; gap: 8px; }
.llfabric-History-source { flex: 1; font-family: var(--jp-code-font-family); white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.llfabric-History-time { color: var(--jp-ui-font-color2); }
.llfabric-History-meta, .llfabric-History-what { color: var(--jp-ui-font-color2);
  font-size: var(--jp-ui-font-size0); }
`;

export class HistoryPanel extends Widget {
  constructor() {
    super();
    this.id = 'llfabric-history';
    this.addClass('llfabric-History');
    this.title.icon = historyIcon;
    this.title.caption = 'llfabric: the session’s versions';
    this.node.dataset.llfabric = 'history';
    if (document.getElementById('llfabric-history-style') === null) {
      const style = document.createElement('style');
      style.id = 'llfabric-history-style';
      style.textContent = STYLE;
      document.head.appendChild(style);
    }
    this.node.addEventListener('click', event => this._onClick(event));
    this._render();
  }

  // Show `link`'s session (the current notebook's), following its changes.
  follow(link: Link | undefined): void {
    if (link === this._link) {
      return;
    }
    this._link?.historyChanged.disconnect(this._render, this);
    this._link = link;
    link?.historyChanged.connect(this._render, this);
    this._render();
  }

  private _onClick(event: MouseEvent): void {
    const row = (event.target as HTMLElement).closest<HTMLElement>('[data-version]');
    if (row === null || this._link === undefined || row.dataset.head === 'true') {
      return;
    }
    this._link.checkout(Number(row.dataset.version));
  }

  private _render(): void {
    const history: IHistory | null = this._link?.history ?? null;
    this.node.replaceChildren();
    if (history === null) {
      this.node.append(note('No notebook attached to llfabric is active.'));
      return;
    }
    const header = document.createElement('div');
    header.className = 'llfabric-History-header';
    header.textContent = `llfabric session ${history.session} · version ${history.version}`;
    this.node.append(header);
    if (history.error) {
      this.node.append(note(`The versions could not be read: ${history.error}`));
    }
    this.node.append(note('Click a version to check it out: the next cell runs on its state.'));
    const list = document.createElement('ul');
    list.className = 'llfabric-History-list';
    for (const version of history.versions) {
      list.append(row(version, version.version === history.version));
    }
    list.append(empty(history.version === 0));
    this.node.append(list);
  }

  private _link: Link | undefined = undefined;
}

function note(text: string): HTMLElement {
  const div = document.createElement('div');
  div.className = 'llfabric-History-note';
  div.textContent = text;
  return div;
}

// One entry: its cell (`source`, when it ran: `time`), then `lines` of detail.
function item(
  version: number,
  head: boolean,
  source: string,
  time: string,
  lines: string[],
  title: string
): HTMLElement {
  const li = document.createElement('li');
  li.className = 'llfabric-History-version' + (head ? ' llfabric-mod-head' : '');
  li.dataset.version = String(version);
  li.dataset.head = String(head);
  li.title = head ? `version ${version}: the session's state now` : title;
  const cell = div('llfabric-History-cell', [div('llfabric-History-source', source)]);
  if (time) {
    cell.append(div('llfabric-History-time', time));
  }
  li.append(cell);
  ['llfabric-History-meta', 'llfabric-History-what'].forEach((name, i) => {
    if (lines[i]) {
      li.append(div(name, lines[i]));
    }
  });
  return li;
}

function div(className: string, content: string | HTMLElement[]): HTMLElement {
  const element = document.createElement('div');
  element.className = className;
  if (typeof content === 'string') {
    element.textContent = content;
  } else {
    element.append(...content);
  }
  return element;
}

function row(v: IVersion, head: boolean): HTMLElement {
  const cell =
    v.checkout === null || v.checkout === undefined
      ? `[${v.execution_count}] ${v.first_line}${v.lines > 1 ? ' …' : ''}`
      : v.checkout === 0
        ? 'restart'
        : `checkout of version ${v.checkout}`;
  const when = new Date(v.time * 1000).toLocaleTimeString();
  const size = v.size === null ? 'thinned' : bytes(v.size);
  const tags = v.tags.length ? ` · ${v.tags.join(', ')}` : '';
  const failed = v.status && v.status !== 'ok' ? ` · ${v.status}` : '';
  const meta = `${size} · ${v.variables} variable${v.variables === 1 ? '' : 's'}${failed}${tags} · version ${v.version}`;
  const changes = [
    ...v.added.map(n => `+${n}`),
    ...v.changed.map(n => `~${n}`),
    ...v.removed.map(n => `−${n}`)
  ];
  const what =
    (changes.length ? changes.join(' ') : 'no variable changed') +
    (v.more ? ` (+${v.more} more)` : '') +
    (v.unsaved.length ? ` · unsaved: ${v.unsaved.join(', ')}` : '');
  return item(v.version, head, cell, when, [meta, what], `check out version ${v.version}`);
}

function empty(head: boolean): HTMLElement {
  return item(
    0,
    head,
    'the empty state',
    '',
    ['before the first cell (as after Restart Kernel) · version 0'],
    'check out version 0: no variables, as a new kernel'
  );
}

function bytes(n: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000;
    i += 1;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}
