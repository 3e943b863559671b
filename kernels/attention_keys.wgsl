// Which keys a query row sees, appended to the attention families
// (attention, and so attention_qkv; attention_coop). Each defines `P` with
// `window` and `capacity`, and `POS`, the rows' positions.

// Keys of row t: [lo, pos + 1), never more than the cache holds.
fn key_range(t: u32) -> vec2<u32> {
    let pos = POS[t];
    var lo = 0u;
    if (P.window > 0u && pos + 1u > P.window) {
        lo = pos + 1u - P.window;
    }
    if (pos + 1u - lo > P.capacity) {
        lo = pos + 1u - P.capacity;
    }
    return vec2<u32>(lo, pos + 1u);
}
