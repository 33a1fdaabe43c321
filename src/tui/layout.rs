//! Where the parts of the frame go: the header, host and tab rows, the body, the footer, and
//! each view's tab. Render draws into these areas (`ui`) and the app resolves clicks and pages
//! against the same ones (`App::areas`).

use super::action::ViewId;
use super::data::{Data, Level};
use super::keymap::Keymap;
use ratatui::layout::Rect;

/// Where each part of the frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    pub header: Rect,
    pub host: Rect,
    pub tabs: Rect,
    pub body: Rect,
    pub footer: Rect,
}

impl Areas {
    /// The parts of `area` with a footer `footer_h` rows high (1, or more for a long error).
    pub fn of(area: Rect, footer_h: u16) -> Areas {
        let row = |i: u16| {
            Rect::new(
                area.x,
                area.y + i.min(area.height),
                area.width,
                u16::from(i < area.height),
            )
        };
        let footer_h = footer_h.clamp(1, 3);
        let body_h = area.height.saturating_sub(3 + footer_h);
        let footer_y = area.y + (3 + body_h).min(area.height);
        Areas {
            header: row(0),
            host: row(1),
            tabs: row(2),
            body: Rect::new(area.x, area.y + 3.min(area.height), area.width, body_h),
            footer: Rect::new(
                area.x,
                footer_y,
                area.width,
                footer_h.min(area.height.saturating_sub(footer_y - area.y)),
            ),
        }
    }
}

/// An error message wraps onto up to three footer rows; everything else fits in one (and while
/// the footer asks something, `modal`, it is one row).
pub fn footer_height(modal: bool, data: &Data, width: u16) -> u16 {
    if modal {
        return 1;
    }
    match data.visible_status() {
        Some(s) if s.level == Level::Error => {
            let len = s.text.chars().count() as u16 + 2;
            len.div_ceil(width.max(1)).clamp(1, 3)
        }
        _ => 1,
    }
}

/// A view's tab: its title, after the key that shows it (from the keymap) when there is one.
pub fn tab_label(keymap: &Keymap, v: ViewId) -> String {
    match keymap.view_key(v) {
        Some(k) => format!(" {k} {} ", v.title()),
        None => format!(" {} ", v.title()),
    }
}

/// The view whose tab covers column `x`.
pub fn tab_at(keymap: &Keymap, tabs: Rect, x: u16) -> Option<ViewId> {
    let mut left = tabs.x + 1;
    for v in ViewId::ALL {
        let w = tab_label(keymap, v).chars().count() as u16;
        if (left..left + w).contains(&x) {
            return Some(v);
        }
        left += w + 1;
    }
    None
}
