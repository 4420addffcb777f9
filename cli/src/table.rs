//! Plain-text tables as kOps prints them: columns padded to their widest cell, two spaces apart, and the `-o` choice of the `get` commands.

/// How the list is printed (kOps' `-o`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Yaml,
    Json,
}

/// `value` as `-o` asks: the `table` text, YAML or indented JSON (one trailing newline).
pub fn render<T: serde::Serialize + ?Sized>(output: Output, value: &T, table: impl FnOnce(&T) -> String) -> anyhow::Result<String> {
    use anyhow::Context as _;
    Ok(match output {
        Output::Table => table(value),
        Output::Yaml => serde_yaml_ng::to_string(value).context("rendering YAML")?,
        Output::Json => serde_json::to_string_pretty(value).context("rendering JSON")? + "\n",
    })
}

/// Columns padded to their widest cell, two spaces apart (the last one unpadded).
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let t = columns(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()], vec!["w".into(), "22".into()]]);
        assert_eq!(t, "A    LONGER\nxyz  1\nw    22\n");
    }
}
