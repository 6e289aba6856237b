//! `strftime_now(format)` for chat templates (Llama 3.x puts today's date in the system prompt).
//! The time is UTC; the common C `strftime` fields are supported, plus glibc's `%-d` no-pad form.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DateTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize,
    day_of_year: u32,
}

impl DateTime {
    fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let day_of_year = u32::try_from(days - days_from_civil(year, 1, 1) + 1).unwrap_or(1);
        Self {
            year,
            month,
            day,
            hour: u32::try_from(rem / 3600).unwrap_or(0),
            minute: u32::try_from(rem % 3600 / 60).unwrap_or(0),
            second: u32::try_from(rem % 60).unwrap_or(0),
            weekday: usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0),
            day_of_year,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        year,
        u32::try_from(month).unwrap_or(1),
        u32::try_from(day).unwrap_or(1),
    )
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The current UTC time formatted like C `strftime`.
pub(crate) fn strftime_now(format: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(0))
        .unwrap_or(0);
    strftime(format, &DateTime::from_unix(secs))
}

fn strftime(format: &str, t: &DateTime) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let no_pad = spec == Some('-');
        if no_pad {
            spec = chars.next();
        }
        let num = |out: &mut String, value: u32, width: usize| {
            if no_pad {
                let _ = write!(out, "{value}");
            } else {
                let _ = write!(out, "{value:0width$}");
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        match spec {
            Some('Y') => {
                let _ = write!(out, "{}", t.year);
            }
            Some('y') => num(
                &mut out,
                u32::try_from(t.year.rem_euclid(100)).unwrap_or(0),
                2,
            ),
            Some('m') => num(&mut out, t.month, 2),
            Some('d') => num(&mut out, t.day, 2),
            Some('e') => {
                let _ = write!(out, "{:>2}", t.day);
            }
            Some('H') => num(&mut out, t.hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('M') => num(&mut out, t.minute, 2),
            Some('S') => num(&mut out, t.second, 2),
            Some('j') => num(&mut out, t.day_of_year, 3),
            Some('p') => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            Some('a') => out.push_str(&WEEKDAYS[t.weekday][..3]),
            Some('A') => out.push_str(WEEKDAYS[t.weekday]),
            Some('b') | Some('h') => out.push_str(&MONTHS[month_index(t.month)][..3]),
            Some('B') => out.push_str(MONTHS[month_index(t.month)]),
            Some('F') => {
                let _ = write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day);
            }
            Some('T') => {
                let _ = write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second);
            }
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn month_index(month: u32) -> usize {
    usize::try_from(month.clamp(1, 12) - 1).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208.
        let t =
            DateTime::from_unix(1_722_000_000 - 1_722_000_000 % 86_400 + 13 * 3600 + 5 * 60 + 9);
        assert_eq!(strftime("%d %b %Y", &t), "26 Jul 2024");
        assert_eq!(
            strftime("%A, %B %-d, %Y %H:%M:%S %p", &t),
            "Friday, July 26, 2024 13:05:09 PM"
        );
        assert_eq!(
            strftime("%F %T %j %y %I %% %q", &t),
            "2024-07-26 13:05:09 208 24 01 % %q"
        );
        let epoch = DateTime::from_unix(0);
        assert_eq!(strftime("%a %Y-%m-%d", &epoch), "Thu 1970-01-01");
        let leap = DateTime::from_unix(951_782_400); // 2000-02-29
        assert_eq!(strftime("%Y-%m-%d %j", &leap), "2000-02-29 060");
    }

    #[test]
    fn now_has_a_plausible_year() {
        let year: i64 = strftime_now("%Y").parse().unwrap();
        assert!(year >= 2024);
    }
}
