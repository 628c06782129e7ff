//! Drawing: the header, the tabs, the selected tab's table, the status and key lines. Reads
//! the [`App`]; changes nothing.

use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row as TableRow, Table, Tabs, Wrap};
use ratatui::Frame;

use crate::app::{App, Tab};
use crate::model::{Row, Sort};

pub const KEYS: &str = "Tab/1-3 tabs  s/S sort column  r reverse  h histograms  q quit";

pub fn draw(f: &mut Frame, app: &App) {
    let [head, tabs, body, status, keys] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Fill(1), Constraint::Length(1), Constraint::Length(1)])
            .areas(f.area());
    f.render_widget(Paragraph::new(header(app)), head);
    let titles = Tab::ALL.iter().map(|t| format!("{} {}", t.index() + 1, t.title()));
    let selected = Style::new().fg(Color::Black).bg(Color::Cyan).add_modifier(Modifier::BOLD);
    f.render_widget(Tabs::new(titles).select(app.tab.index()).highlight_style(selected), tabs);
    match &app.down {
        Some((why, since)) => {
            let text = vec![
                Line::styled(format!("riser is not answering on {}", app.sock.display()), Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)),
                Line::raw(why.clone()),
                Line::raw(format!("retrying every {} (for {} s)", secs(app.interval.as_secs_f64()), since.elapsed().as_secs())),
            ];
            let p = Paragraph::new(text).wrap(Wrap { trim: false }).block(Block::new().borders(Borders::ALL));
            f.render_widget(p, body);
        }
        None => match app.tab {
            Tab::Reactors => table(f, body, Tab::Reactors, &app.reactor_rows(), app.sorts[0]),
            Tab::Connections => table(f, body, Tab::Connections, &app.conn_rows(), app.sorts[1]),
            Tab::Devices => table(f, body, Tab::Devices, &app.dev_rows(), app.sorts[2]),
        },
    }
    let line = match (&app.down, app.notes.is_empty()) {
        (Some(_), _) => Line::styled("riser down", Style::new().fg(Color::Red)),
        (None, true) => Line::raw(if app.cur.is_some() { "ok" } else { "connecting..." }),
        (None, false) => Line::styled(app.notes.join("; "), Style::new().fg(Color::Yellow)),
    };
    f.render_widget(Paragraph::new(line), status);
    f.render_widget(Paragraph::new(Line::styled(KEYS, Style::new().add_modifier(Modifier::DIM))), keys);
}

/// "riser-top  riser v0.1.0  /var/tmp/riser.sock  poll mode busy  every 1 s  histograms off"
fn header(app: &App) -> Line<'static> {
    let cur = app.cur.as_ref();
    let version = cur.and_then(|c| c.version.clone()).unwrap_or_else(|| "-".into());
    let mode = cur.and_then(|c| c.reactors.as_ref()).and_then(|r| r.poll_mode.clone()).unwrap_or_else(|| "-".into());
    Line::from(vec![
        Span::styled("riser-top", Style::new().add_modifier(Modifier::BOLD)),
        Span::raw(format!(
            "  {version}  {}  poll mode {mode}  every {}  histograms {}",
            app.sock.display(),
            secs(app.interval.as_secs_f64()),
            if app.histograms_on() { "on" } else { "off" }
        )),
    ])
}

fn secs(s: f64) -> String {
    format!("{s} s")
}

/// A table of `rows`, the sorted column's title marked ▼ (biggest first) or ▲.
fn table<R: Row>(f: &mut Frame, area: Rect, tab: Tab, rows: &[R], sort: Sort) {
    let cols = R::COLUMNS;
    let desc = sort.descending::<R>();
    let align = |numeric: bool| if numeric { Alignment::Right } else { Alignment::Left };
    let header = TableRow::new(cols.iter().enumerate().map(|(i, c)| {
        let (title, style) = if i == sort.col {
            let mark = if desc { "▼" } else { "▲" };
            (format!("{}{mark}", c.title), Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED))
        } else {
            (c.title.to_string(), Style::new().add_modifier(Modifier::BOLD))
        };
        Cell::from(Line::from(title).alignment(align(c.numeric))).style(style)
    }));
    let body = rows
        .iter()
        .map(|r| TableRow::new(r.cells().into_iter().zip(cols.iter()).map(|(text, c)| Cell::from(Line::from(text).alignment(align(c.numeric))))));
    let widths = cols.iter().map(|c| match c.width {
        0 => Constraint::Fill(1),
        // Room for the title and its sort mark.
        w => Constraint::Length(w.max(c.title.chars().count() as u16 + 1)),
    });
    let sorted_by = cols.get(sort.col).map_or("-", |c| c.title);
    let title = format!(" {} ({}), sorted by {sorted_by} ", tab.title(), rows.len());
    let t = Table::new(body, widths).header(header).block(Block::new().borders(Borders::ALL).title(title)).column_spacing(1);
    f.render_widget(t, area);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::Msg;
    use crate::model::{Conn, IoStat, Reactors, Sample};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use serde_json::json;
    use std::path::PathBuf;
    use std::time::Duration;

    fn screen(app: &App) -> String {
        let mut t = Terminal::new(TestBackend::new(140, 20)).expect("test terminal");
        t.draw(|f| draw(f, app)).expect("draw");
        let buf = t.backend().buffer().clone();
        let mut s = String::new();
        for y in 0..buf.area.height {
            for x in 0..buf.area.width {
                s.push_str(buf[(x, y)].symbol());
            }
            s.push('\n');
        }
        s
    }

    #[test]
    fn draws_every_tab_and_the_down_screen() {
        let mut app = App::new(PathBuf::from("/tmp/r.sock"), Duration::from_secs(1));
        let sample = |at_s: f64, busy: u64, reads: u64| Sample {
            at_s,
            version: Some("riser v0.1.0".into()),
            reactors: Some(Reactors::parse(&json!({"poll_mode": "adaptive",
                "reactors": [{"lcore": 0, "busy": busy, "idle": 1000 + busy, "connections": 1}]}))),
            conns: Some(Conn::parse_list(&json!([{"id": 1, "initiator_name": "iqn.2024-01.io.riser:perf",
                "transport": "tcp", "reactor": 0, "queue_depth": 3}]))),
            iostat: Some(IoStat::parse(&json!({"bdevs": [{"name": "Malloc0", "num_read_ops": reads,
                "num_write_ops": 0}]}))),
            ..Default::default()
        };
        app.on_msg(Msg::Sample { sample: Box::new(sample(0.0, 0, 0)), notes: vec![] });
        app.on_msg(Msg::Sample { sample: Box::new(sample(1.0, 1000, 12345)), notes: vec!["bdev_get_histogram: x".into()] });
        let s = screen(&app);
        assert!(s.contains("riser v0.1.0") && s.contains("poll mode adaptive"), "{s}");
        assert!(s.contains("Busy %") && s.contains("50.0"), "{s}");
        assert!(s.contains("bdev_get_histogram: x"), "{s}");
        app.tab = Tab::Connections;
        let s = screen(&app);
        assert!(s.contains("iqn.2024-01.io.riser:perf") && s.contains("tcp"), "{s}");
        app.tab = Tab::Devices;
        let s = screen(&app);
        assert!(s.contains("Malloc0") && s.contains("12345"), "{s}");
        app.on_msg(Msg::Down("cannot connect to /tmp/r.sock: No such file".into()));
        let s = screen(&app);
        assert!(s.contains("riser is not answering on /tmp/r.sock") && s.contains("retrying every 1 s"), "{s}");
        // A terminal too small for anything: no panic.
        let mut t = Terminal::new(TestBackend::new(3, 2)).expect("test terminal");
        t.draw(|f| draw(f, &app)).expect("draw");
    }
}
