//! What the `turbospark` command line shares with a server: a checkpoint's
//! chat template rendered as transformers renders it ([`template`]), and
//! Gemma 4's replies parsed into OpenAI message parts ([`reply`]). Pure
//! logic: nothing here prints.

pub mod reply;
pub mod template;
