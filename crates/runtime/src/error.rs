//! What a plugin's callback reported, as the runtime's errors carry it.

use std::fmt;

use guild_abi::text::{fixed_buffer_text, status_name};
use guild_abi::{guild_error_info_t, guild_status_t};

/// What a plugin's callback reported (a runner's, an expert or CUDA table's): its status and
/// its error record's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginReason {
    /// The status it returned.
    pub status: guild_status_t,
    /// The record's component.
    pub component: String,
    /// The record's message.
    pub message: String,
}

impl PluginReason {
    pub(crate) fn read(status: guild_status_t, error: &guild_error_info_t) -> Self {
        PluginReason {
            status,
            component: fixed_buffer_text(&error.component),
            message: fixed_buffer_text(&error.message),
        }
    }
}

impl fmt::Display for PluginReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.component.is_empty(), self.message.is_empty()) {
            (_, true) => write!(f, "{} without a message", status_name(self.status)),
            (true, false) => write!(f, "{} ({})", self.message, status_name(self.status)),
            (false, false) => write!(
                f,
                "{}: {} ({})",
                self.component,
                self.message,
                status_name(self.status)
            ),
        }
    }
}
