//! The screen's state: the tab shown, each tab's sort, the last two samples, whether riser
//! answers; and what each key does. Drawing is in `view.rs`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::fetch::Msg;
use crate::model::{self, ConnRow, DevRow, ReactorRow, Row, Sample, Sort};

/// The three tabs, in the order of their number keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tab {
    Reactors,
    Connections,
    Devices,
}

impl Tab {
    pub const ALL: [Tab; 3] = [Tab::Reactors, Tab::Connections, Tab::Devices];

    pub fn index(self) -> usize {
        match self {
            Tab::Reactors => 0,
            Tab::Connections => 1,
            Tab::Devices => 2,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Tab::Reactors => "Reactors",
            Tab::Connections => "Connections",
            Tab::Devices => "Devices",
        }
    }

    fn columns(self) -> usize {
        match self {
            Tab::Reactors => ReactorRow::COLUMNS.len(),
            Tab::Connections => ConnRow::COLUMNS.len(),
            Tab::Devices => DevRow::COLUMNS.len(),
        }
    }
}

/// What a key asks the main loop to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Redraw,
    Quit,
    /// Latency histograms of every device on or off.
    Histograms(bool),
}

pub struct App {
    pub sock: PathBuf,
    pub interval: Duration,
    pub tab: Tab,
    /// One sort per tab, by [`Tab::index`].
    pub sorts: [Sort; 3],
    pub prev: Option<Sample>,
    pub cur: Option<Sample>,
    /// Parts of the last sample riser did not give.
    pub notes: Vec<String>,
    /// Why riser does not answer, and since when; None while it answers.
    pub down: Option<(String, Instant)>,
    /// Histograms as last asked with `h`; None: as riser has them.
    pub histograms: Option<bool>,
}

impl App {
    pub fn new(sock: PathBuf, interval: Duration) -> App {
        App {
            sock,
            interval,
            tab: Tab::Reactors,
            sorts: [Sort::default(); 3],
            prev: None,
            cur: None,
            notes: Vec::new(),
            down: None,
            histograms: None,
        }
    }

    pub fn on_msg(&mut self, msg: Msg) {
        match msg {
            Msg::Sample { sample, notes } => {
                self.prev = self.cur.take();
                self.cur = Some(*sample);
                self.notes = notes;
                self.down = None;
            }
            Msg::Down(why) => {
                // Rates across a restart would be wrong: start again from nothing.
                self.prev = None;
                self.cur = None;
                self.notes.clear();
                let since = self.down.as_ref().map_or_else(Instant::now, |(_, t)| *t);
                self.down = Some((why, since));
            }
        }
    }

    /// Whether the devices' histograms are on: as asked, else as the last sample says.
    pub fn histograms_on(&self) -> bool {
        self.histograms.unwrap_or_else(|| self.cur.as_ref().is_some_and(Sample::any_histogram_on))
    }

    pub fn on_key(&mut self, k: KeyEvent) -> Action {
        if k.kind == KeyEventKind::Release {
            return Action::None;
        }
        let tab = self.tab.index();
        match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Action::Quit,
            KeyCode::Char('q') | KeyCode::Char('Q') | KeyCode::Esc => Action::Quit,
            KeyCode::Tab | KeyCode::Right => self.switch(Tab::ALL[(tab + 1) % 3]),
            KeyCode::BackTab | KeyCode::Left => self.switch(Tab::ALL[(tab + 2) % 3]),
            KeyCode::Char('1') => self.switch(Tab::Reactors),
            KeyCode::Char('2') => self.switch(Tab::Connections),
            KeyCode::Char('3') => self.switch(Tab::Devices),
            KeyCode::Char(c @ ('s' | 'S')) => {
                let n = self.tab.columns();
                let s = &mut self.sorts[tab];
                s.col = if c == 's' { (s.col + 1) % n } else { (s.col + n - 1) % n };
                s.reverse = false;
                Action::Redraw
            }
            KeyCode::Char('r') => {
                self.sorts[tab].reverse = !self.sorts[tab].reverse;
                Action::Redraw
            }
            KeyCode::Char('h') => {
                let on = !self.histograms_on();
                self.histograms = Some(on);
                Action::Histograms(on)
            }
            _ => Action::None,
        }
    }

    fn switch(&mut self, t: Tab) -> Action {
        self.tab = t;
        Action::Redraw
    }

    pub fn reactor_rows(&self) -> Vec<ReactorRow> {
        let mut rows = self.cur.as_ref().map_or_else(Vec::new, |c| model::reactor_rows(self.prev.as_ref(), c));
        model::sort_rows(&mut rows, self.sorts[Tab::Reactors.index()]);
        rows
    }

    pub fn conn_rows(&self) -> Vec<ConnRow> {
        let mut rows = self.cur.as_ref().map_or_else(Vec::new, |c| model::conn_rows(self.prev.as_ref(), c));
        model::sort_rows(&mut rows, self.sorts[Tab::Connections.index()]);
        rows
    }

    pub fn dev_rows(&self) -> Vec<DevRow> {
        let mut rows = self.cur.as_ref().map_or_else(Vec::new, |c| model::dev_rows(self.prev.as_ref(), c));
        model::sort_rows(&mut rows, self.sorts[Tab::Devices.index()]);
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Hist, IoStat};
    use serde_json::json;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    #[test]
    fn keys_switch_tabs_sort_and_quit() {
        let mut a = App::new(PathBuf::from("/x"), Duration::from_secs(1));
        assert_eq!(a.on_key(key(KeyCode::Tab)), Action::Redraw);
        assert_eq!(a.tab, Tab::Connections);
        a.on_key(key(KeyCode::Tab));
        a.on_key(key(KeyCode::Tab));
        assert_eq!(a.tab, Tab::Reactors);
        a.on_key(key(KeyCode::BackTab));
        assert_eq!(a.tab, Tab::Devices);
        a.on_key(key(KeyCode::Char('2')));
        assert_eq!(a.tab, Tab::Connections);
        // s walks the columns and wraps; S walks back; r turns the order around.
        for _ in 0..ConnRow::COLUMNS.len() - 1 {
            a.on_key(key(KeyCode::Char('s')));
        }
        assert_eq!(a.sorts[1].col, ConnRow::COLUMNS.len() - 1);
        a.on_key(key(KeyCode::Char('s')));
        assert_eq!(a.sorts[1].col, 0);
        a.on_key(key(KeyCode::Char('S')));
        assert_eq!(a.sorts[1].col, ConnRow::COLUMNS.len() - 1);
        a.on_key(key(KeyCode::Char('r')));
        assert!(a.sorts[1].reverse);
        // The other tabs keep their own sort.
        assert_eq!(a.sorts[0], Sort::default());
        assert_eq!(a.on_key(key(KeyCode::Char('x'))), Action::None);
        assert_eq!(a.on_key(key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(a.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)), Action::Quit);
    }

    #[test]
    fn h_toggles_from_what_riser_says() {
        let mut a = App::new(PathBuf::from("/x"), Duration::from_secs(1));
        let s = Sample {
            iostat: Some(IoStat::parse(&json!({"bdevs": [{"name": "N"}]}))),
            hists: [("N".to_string(), Hist::parse(&json!({"enabled": true})))].into_iter().collect(),
            ..Default::default()
        };
        a.on_msg(Msg::Sample { sample: Box::new(s), notes: vec![] });
        // Someone else turned them on already: h turns them off.
        assert_eq!(a.on_key(key(KeyCode::Char('h'))), Action::Histograms(false));
        assert_eq!(a.on_key(key(KeyCode::Char('h'))), Action::Histograms(true));
    }

    #[test]
    fn down_clears_the_samples_and_keeps_the_first_time() {
        let mut a = App::new(PathBuf::from("/x"), Duration::from_secs(1));
        a.on_msg(Msg::Sample { sample: Box::default(), notes: vec!["n".into()] });
        a.on_msg(Msg::Sample { sample: Box::default(), notes: vec![] });
        assert!(a.prev.is_some());
        a.on_msg(Msg::Down("gone".into()));
        let t0 = a.down.as_ref().map(|d| d.1);
        a.on_msg(Msg::Down("still gone".into()));
        assert_eq!(a.down.as_ref().map(|d| d.1), t0);
        assert_eq!(a.down.as_ref().map(|d| d.0.as_str()), Some("still gone"));
        assert!(a.cur.is_none() && a.prev.is_none());
        assert!(a.reactor_rows().is_empty() && a.conn_rows().is_empty() && a.dev_rows().is_empty());
        a.on_msg(Msg::Sample { sample: Box::default(), notes: vec![] });
        assert!(a.down.is_none());
    }
}
