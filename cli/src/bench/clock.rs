//! The wall clock as UTC text, for the report's date and each measurement's
//! time (lined up with a GPU clock log).

/// UTC now as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let (secs, _) = unix_now();
    utc(secs) + "Z"
}

/// UTC now as `YYYY-MM-DDTHH:MM:SS.mmmZ` (to line up with a clock log
/// sampled every 200 ms).
pub fn utc_now_ms() -> String {
    let (secs, ms) = unix_now();
    format!("{}.{ms:03}Z", utc(secs))
}

/// Seconds and milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_now() -> (i64, u32) {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, d.subsec_millis()))
        .unwrap_or((0, 0))
}

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS`, UTC.
fn utc(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
