//! `strftime_now`'s clock and formatting: the local time (UTC where the
//! platform's local time is not read) written with C's `strftime`
//! directives, as Python's `datetime.strftime` passes them on.

use std::time::{SystemTime, UNIX_EPOCH};

/// A broken-down time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tm {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub yearday: u32,
}

/// The time now, local where the platform says what local is.
pub fn now_local() -> Tm {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    local(secs).unwrap_or_else(|| utc(secs))
}

#[cfg(unix)]
fn local(secs: i64) -> Option<Tm> {
    let t = secs as libc::time_t;
    // SAFETY: localtime_r writes only the tm it is given; zeroed is a valid tm.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let ok = unsafe { !libc::localtime_r(&t, &mut tm).is_null() };
    ok.then(|| Tm {
        year: tm.tm_year as i64 + 1900,
        month: tm.tm_mon as u32 + 1,
        day: tm.tm_mday as u32,
        hour: tm.tm_hour as u32,
        minute: tm.tm_min as u32,
        second: tm.tm_sec as u32,
        weekday: tm.tm_wday as u32,
        yearday: tm.tm_yday as u32 + 1,
    })
}

#[cfg(not(unix))]
fn local(_secs: i64) -> Option<Tm> {
    None
}

/// `secs` since the epoch in UTC (days to a civil date: Howard Hinnant's
/// algorithm).
pub fn utc(secs: i64) -> Tm {
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400) as u32;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yearday = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
    Tm {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
        weekday: (days + 4).rem_euclid(7) as u32,
        yearday,
    }
}

const DAYS: [&str; 7] = [
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

/// `fmt` with `tm` (the C locale's names): `%Y %y %m %d %e %H %I %M %S %p
/// %j %a %A %b %B %h %F %T %D %R %%`, a `-` after `%` dropping the padding
/// (glibc's, which Python passes on); other directives stay as written.
pub fn strftime(fmt: &str, tm: &Tm) -> String {
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |v: i64, width: usize| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:0width$}")
            }
        };
        let hour12 = match tm.hour % 12 {
            0 => 12,
            h => h,
        };
        let day = DAYS[tm.weekday as usize % 7];
        let month = MONTHS[(tm.month as usize + 11) % 12];
        match chars.next() {
            Some('Y') => out.push_str(&tm.year.to_string()),
            Some('y') => out.push_str(&num(tm.year.rem_euclid(100), 2)),
            Some('m') => out.push_str(&num(tm.month.into(), 2)),
            Some('d') => out.push_str(&num(tm.day.into(), 2)),
            Some('e') => out.push_str(&format!("{:>2}", tm.day)),
            Some('H') => out.push_str(&num(tm.hour.into(), 2)),
            Some('I') => out.push_str(&num(hour12.into(), 2)),
            Some('M') => out.push_str(&num(tm.minute.into(), 2)),
            Some('S') => out.push_str(&num(tm.second.into(), 2)),
            Some('p') => out.push_str(if tm.hour < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&num(tm.yearday.into(), 3)),
            Some('a') => out.push_str(&day[..3]),
            Some('A') => out.push_str(day),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('F') => out.push_str(&format!("{}-{:02}-{:02}", tm.year, tm.month, tm.day)),
            Some('T') => out.push_str(&format!("{:02}:{:02}:{:02}", tm.hour, tm.minute, tm.second)),
            Some('R') => out.push_str(&format!("{:02}:{:02}", tm.hour, tm.minute)),
            Some('D') => out.push_str(&format!(
                "{:02}/{:02}/{:02}",
                tm.month,
                tm.day,
                tm.year.rem_euclid(100)
            )),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-02-29 13:05:09 UTC, a Thursday, the 60th day (Python:
    /// `datetime(2024,2,29,13,5,9).strftime(...)`).
    #[test]
    fn formats_as_python_does() {
        let tm = utc(1_709_211_909);
        assert_eq!(
            tm,
            Tm {
                year: 2024,
                month: 2,
                day: 29,
                hour: 13,
                minute: 5,
                second: 9,
                weekday: 4,
                yearday: 60
            }
        );
        assert_eq!(
            strftime(
                "%d %b %Y, %A %B %j %I:%M:%S %p %-d/%-m %y %e %F %T %% %Q",
                &tm
            ),
            "29 Feb 2024, Thursday February 060 01:05:09 PM 29/2 24 29 2024-02-29 13:05:09 % %Q"
        );
        assert_eq!(utc(0).weekday, 4, "1970-01-01 was a Thursday");
        assert_eq!((utc(-86400).year, utc(-86400).yearday), (1969, 365));
    }
}
