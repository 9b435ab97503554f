// llfabric in JupyterLab: a status bar item for the current notebook's session, notices as
// notifications, live drafts of the cell being edited, and a History side panel of the
// session's versions that checks one out with a click.
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';
import { HistoryPanel } from './history';
import { StatusItem } from './item';
import { Link } from './link';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'llfabric-lab:plugin',
  description: 'The llfabric session of a notebook: status, notices, live drafts and history',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker, statusBar: IStatusBar | null) => {
    const links = new Map<NotebookPanel, Link>();
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
