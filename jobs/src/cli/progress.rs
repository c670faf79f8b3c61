//! Progress on stderr: a bar on a terminal, summary lines otherwise.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// The progress display of one run.
pub(super) struct Feedback {
    bar: Option<ProgressBar>,
}

impl Feedback {
    pub(super) fn new() -> Feedback {
        Feedback { bar: None }
    }

    /// Starts a stage of `total` steps (a bar only on a terminal).
    pub(super) fn stage(&mut self, what: &str, total: u64) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        if std::io::stderr().is_terminal() && !super::silent() {
            let b = ProgressBar::new(total);
            let style = ProgressStyle::with_template(
                "{msg:>12} [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            b.set_style(style);
            b.set_message(what.to_string());
            self.bar = Some(b);
        }
    }

    /// Steps done in the current stage.
    pub(super) fn progress(&self, done: u64) {
        if let Some(b) = &self.bar {
            b.set_position(done);
        }
    }

    /// A summary line, printed above the bar.
    pub(super) fn line(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => say!("{msg}"),
        }
    }

    /// Ends the current stage.
    pub(super) fn done(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
