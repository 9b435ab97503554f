// llfabric in JupyterLab: a status bar item for the current notebook's session, notices as
// notifications, live drafts of the cell being edited, and a History side panel of the
// session's versions that checks one out with a click.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';
import { HistoryPanel } from './history';
import { StatusItem } from './item';
import { Link } from './link';

const TOGGLE_STARTS = 'llfabric-lab:toggle-cell-start';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'llfabric-lab:plugin',
  description: 'The llfabric session of a notebook: status, notices, live drafts and history',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ISettingRegistry, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    settings: ISettingRegistry | null,
    palette: ICommandPalette | null
  ) => {
    const links = new Map<NotebookPanel, Link>();
    let showStarts = false; // the `showCellStart` setting
    void settings?.load(plugin.id).then(loaded => {
      app.commands.addCommand(TOGGLE_STARTS, {
        label: 'Show How Cells Started on llfabric',
        caption: 'Beside each prompt: prepared, warm, restored or cold',
        isToggled: () => showStarts,
        execute: () => loaded.set('showCellStart', !showStarts)
      });
      palette?.addItem({ command: TOGGLE_STARTS, category: 'llfabric' });
      const apply = () => {
        showStarts = loaded.get('showCellStart').composite === true;
        links.forEach(link => (link.starts.shown = showStarts));
        app.commands.notifyCommandChanged(TOGGLE_STARTS);
      };
      apply();
      loaded.changed.connect(apply);
    }, reason => console.warn('llfabric: its settings are not read:', reason));
    const item = new StatusItem();
    const history = new HistoryPanel();
    app.shell.add(history, 'right', { rank: 900 });
    const current = (): Link | undefined =>
      tracker.currentWidget ? links.get(tracker.currentWidget) : undefined;
    const active = new Signal<object, void>(item);
    const refresh = () => {
      item.show_(current()?.status ?? null, current()?.notices);
      history.follow(current());
      active.emit();
    };

    tracker.widgetAdded.connect((_, panel) => {
      const link = new Link(panel);
      link.starts.shown = showStarts;
      links.set(panel, link);
      link.changed.connect(refresh);
      panel.disposed.connect(() => links.delete(panel));
    });
    tracker.currentChanged.connect(refresh);
    statusBar?.registerStatusItem('llfabric-lab:status', {
      item,
      align: 'left',
      rank: 4,
      isActive: () => current()?.status != null,
      activeStateChanged: active
    });
  }
};

export default plugin;
