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

/// `secs` since the epoch as `YYYY-MM-DDTHH:MM:SS`, UTC (the civil date
/// from the template clock's `utc`).
fn utc(secs: i64) -> String {
    let t = turbospark_cli::template::clock::utc(secs);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}
