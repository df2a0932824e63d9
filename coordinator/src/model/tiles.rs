//! Tile geometry: splitting a frame into a grid of pixel rectangles, growing a
//! tile by an overscan margin, and the render-border fractions that make
//! Blender render exactly that rectangle.

use std::fmt;
use std::str::FromStr;

/// Why a tile grid was refused. Each message names the problem and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TileError {
    /// The text is not `CxR` with two whole numbers of at least 1.
    #[error("`{0}` is not a tile grid; use columns x rows like `2x2`")]
    BadGrid(String),
    /// A tile would be narrower or shorter than one pixel.
    #[error(
        "a {cols}x{rows} grid would make tiles under 1 px in a {width}x{height} frame; \
         use at most {width} columns and {height} rows"
    )]
    TooNarrow {
        /// Frame width in pixels.
        width: u32,
        /// Frame height in pixels.
        height: u32,
        /// Columns asked for.
        cols: u32,
        /// Rows asked for.
        rows: u32,
    },
    /// More tiles than the coordinator accepts per frame.
    #[error(
        "a {cols}x{rows} grid has {tiles} tiles, over the limit of {max} tiles per frame; \
         use a coarser grid"
    )]
    TooMany {
        /// Columns asked for.
        cols: u32,
        /// Rows asked for.
        rows: u32,
        /// `cols * rows`.
        tiles: u64,
        /// The configured maximum.
        max: u32,
    },
}

/// A tile grid, columns x rows, parsed from "CxR" (e.g. "3x2"; "1x1" = whole frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Grid {
    /// Tiles across.
    pub cols: u32,
    /// Tiles down.
    pub rows: u32,
}

impl Grid {
    /// The grid of one tile: whole frames.
    pub const WHOLE: Grid = Grid { cols: 1, rows: 1 };

    /// Number of tiles in the grid.
    pub fn count(self) -> u64 {
        u64::from(self.cols) * u64::from(self.rows)
    }
}

impl FromStr for Grid {
    type Err = TileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || TileError::BadGrid(s.to_string());
        let (c, r) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        // `u32::from_str` accepts a leading `+`; a grid has no sign.
        let num = |t: &str| -> Option<u32> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            t.parse().ok().filter(|&n| n >= 1)
        };
        match (num(c), num(r)) {
            (Some(cols), Some(rows)) => Ok(Grid { cols, rows }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for Grid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

/// A pixel rectangle, origin at the TOP-left of the image (PNG row order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Rect {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Width in pixels.
    pub w: u32,
    /// Height in pixels.
    pub h: u32,
}

impl Rect {
    /// One past the right column.
    pub fn right(self) -> u32 {
        self.x + self.w
    }

    /// One past the bottom row.
    pub fn bottom(self) -> u32 {
        self.y + self.h
    }

    /// Whether `other` lies wholly inside `self`.
    pub fn contains(self, other: Rect) -> bool {
        other.x >= self.x
            && other.y >= self.y
            && other.right() <= self.right()
            && other.bottom() <= self.bottom()
    }
}

impl fmt::Display for Rect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{} at {},{}", self.w, self.h, self.x, self.y)
    }
}

/// The `i`-th of `n` cut positions across `size` pixels: `floor(i * size / n)`,
/// so consecutive spans differ by at most one pixel.
fn cut(i: u32, n: u32, size: u32) -> u32 {
    // `i <= n`, so the quotient is at most `size` and fits a u32.
    (u64::from(i) * u64::from(size) / u64::from(n)) as u32
}

/// Splits width x height into the grid, row-major from the top-left; tiles
/// cover the image with no gap or overlap; sizes that don't divide evenly are
/// spread so tiles differ by at most 1 px. Refuses a grid where a tile would be
/// narrower/shorter than 1 px, or more than `max_tiles` tiles.
pub fn split(width: u32, height: u32, grid: Grid, max_tiles: u32) -> Result<Vec<Rect>, TileError> {
    let Grid { cols, rows } = grid;
    if cols == 0 || rows == 0 {
        return Err(TileError::BadGrid(grid.to_string()));
    }
    if grid.count() > u64::from(max_tiles) {
        return Err(TileError::TooMany {
            cols,
            rows,
            tiles: grid.count(),
            max: max_tiles,
        });
    }
    if cols > width || rows > height {
        return Err(TileError::TooNarrow {
            width,
            height,
            cols,
            rows,
        });
    }
    let mut tiles = Vec::with_capacity(grid.count() as usize);
    for r in 0..rows {
        let (y0, y1) = (cut(r, rows, height), cut(r + 1, rows, height));
        for c in 0..cols {
            let (x0, x1) = (cut(c, cols, width), cut(c + 1, cols, width));
            tiles.push(Rect {
                x: x0,
                y: y0,
                w: x1 - x0,
                h: y1 - y0,
            });
        }
    }
    Ok(tiles)
}

/// The tile grown by `overscan` px on each side, clamped to the image.
pub fn with_overscan(r: Rect, overscan: u32, width: u32, height: u32) -> Rect {
    let x0 = r.x.saturating_sub(overscan);
    let y0 = r.y.saturating_sub(overscan);
    let x1 = r.right().saturating_add(overscan).min(width);
    let y1 = r.bottom().saturating_add(overscan).min(height);
    Rect {
        x: x0,
        y: y0,
        w: x1 - x0,
        h: y1 - y0,
    }
}

/// The border fraction that makes Blender cut at pixel edge `edge` of `size`.
///
/// Blender stores the border as float32 and computes each edge as
/// `int(border * size)` (a float32 product, truncated toward zero; see
/// `render_init_from_main`). The exact fraction `edge / size` is usually not
/// representable, and when float32 rounds it down the product lands just
/// below `edge` and truncates to `edge - 1` (`63/240` gives 62 rows). Aiming
/// at the pixel centre, `(edge + 0.5) / size`, puts the product half a pixel
/// above `edge`, far beyond float32's error (about `size * 2^-24` px), so it
/// truncates to `edge` for any frame under millions of pixels across. The two
/// frame edges are exact: `0.0` and `1.0` (Blender clamps the border to 0..1,
/// so the centre formula could not reach `size` anyway).
fn border_fraction(edge: u32, size: u32) -> f64 {
    if edge == 0 {
        0.0
    } else if edge >= size {
        1.0
    } else {
        (f64::from(edge) + 0.5) / f64::from(size)
    }
}

/// Blender's render border for `r`: (min_x, max_x, min_y, max_y) as fractions,
/// Blender's y axis from the BOTTOM, chosen as pixel-centre fractions so
/// float32 truncation can never move an edge (the reasoning is on `border_fraction`).
/// `width` x `height` is the output size (resolution times percentage). With
/// `use_border` and `use_crop_to_border` Blender then writes an image of
/// exactly `r.w` x `r.h` pixels (checked for every edge of 320x240 with
/// Blender 3.4.1, where the naive `edge / size` missed 8 of 1116 edges).
pub fn blender_border(r: Rect, width: u32, height: u32) -> (f64, f64, f64, f64) {
    // Rows counted from the bottom: the tile's bottom row is Blender's min_y.
    let y_min = height.saturating_sub(r.bottom());
    let y_max = height.saturating_sub(r.y);
    (
        border_fraction(r.x, width),
        border_fraction(r.right(), width),
        border_fraction(y_min, height),
        border_fraction(y_max, height),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Blender's edge arithmetic: float32 border times the size, truncated.
    fn blender_edge(fraction: f64, size: u32) -> u32 {
        let f = (fraction as f32).clamp(0.0, 1.0);
        (f * size as f32) as u32
    }

    /// The rectangle (top-left origin) Blender renders for a border.
    fn blender_rect(border: (f64, f64, f64, f64), width: u32, height: u32) -> Rect {
        let (x0, x1) = (blender_edge(border.0, width), blender_edge(border.1, width));
        let (y0, y1) = (
            blender_edge(border.2, height),
            blender_edge(border.3, height),
        );
        Rect {
            x: x0,
            y: height - y1,
            w: x1 - x0,
            h: y1 - y0,
        }
    }

    #[test]
    fn parses_grids() {
        assert_eq!("3x2".parse::<Grid>().unwrap(), Grid { cols: 3, rows: 2 });
        assert_eq!(" 1X1 ".parse::<Grid>().unwrap(), Grid::WHOLE);
        for bad in [
            "", "3", "x2", "3x", "0x2", "2x0", "-1x2", "+2x2", "2x2x2", "axb", "2 x 2",
        ] {
            let err = bad.parse::<Grid>().unwrap_err();
            assert!(matches!(err, TileError::BadGrid(_)), "{bad}: {err}");
        }
        assert_eq!(
            "0x2".parse::<Grid>().unwrap_err().to_string(),
            "`0x2` is not a tile grid; use columns x rows like `2x2`"
        );
    }

    #[test]
    fn splits_unevenly_from_the_top_left() {
        let tiles = split(10, 5, Grid { cols: 3, rows: 2 }, 64).unwrap();
        let expect = [
            (0, 0, 3, 2),
            (3, 0, 3, 2),
            (6, 0, 4, 2),
            (0, 2, 3, 3),
            (3, 2, 3, 3),
            (6, 2, 4, 3),
        ];
        let expect: Vec<Rect> = expect
            .iter()
            .map(|&(x, y, w, h)| Rect { x, y, w, h })
            .collect();
        assert_eq!(tiles, expect);
    }

    #[test]
    fn refuses_too_fine_or_too_many() {
        let err = split(2, 100, Grid { cols: 3, rows: 1 }, 64).unwrap_err();
        assert!(matches!(err, TileError::TooNarrow { .. }), "{err}");
        let err = split(100, 2, Grid { cols: 1, rows: 3 }, 64).unwrap_err();
        assert!(matches!(err, TileError::TooNarrow { .. }), "{err}");
        let err = split(1000, 1000, Grid { cols: 10, rows: 10 }, 64).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a 10x10 grid has 100 tiles, over the limit of 64 tiles per frame; use a coarser grid"
        );
        // Huge grids are refused by the limit without overflowing or allocating.
        let huge = Grid {
            cols: u32::MAX,
            rows: u32::MAX,
        };
        assert!(matches!(
            split(1, 1, huge, 64),
            Err(TileError::TooMany { .. })
        ));
    }

    #[test]
    fn overscan_clamps_to_the_frame() {
        let r = Rect {
            x: 80,
            y: 0,
            w: 80,
            h: 60,
        };
        assert_eq!(
            with_overscan(r, 16, 321, 239),
            Rect {
                x: 64,
                y: 0,
                w: 112,
                h: 76
            }
        );
        assert_eq!(
            with_overscan(r, 1000, 321, 239),
            Rect {
                x: 0,
                y: 0,
                w: 321,
                h: 239
            }
        );
        assert_eq!(with_overscan(r, 0, 321, 239), r);
    }

    #[test]
    fn naive_fraction_loses_a_row_but_centre_fraction_does_not() {
        // The case from the field notes: an edge at 63 of 240 rows.
        assert_eq!(blender_edge(63.0 / 240.0, 240), 62);
        assert_eq!(blender_edge(border_fraction(63, 240), 240), 63);
    }

    #[test]
    fn border_is_from_the_bottom() {
        let b = blender_border(
            Rect {
                x: 0,
                y: 0,
                w: 10,
                h: 10,
            },
            20,
            40,
        );
        assert_eq!(b, (0.0, 10.5 / 20.0, 30.5 / 40.0, 1.0));
        assert_eq!(
            blender_border(
                Rect {
                    x: 0,
                    y: 0,
                    w: 20,
                    h: 40
                },
                20,
                40
            ),
            (0.0, 1.0, 0.0, 1.0)
        );
    }

    #[test]
    fn every_edge_of_every_size_survives_float32() {
        for size in 1..=4096u32 {
            for edge in 0..=size {
                assert_eq!(
                    blender_edge(border_fraction(edge, size), size),
                    edge,
                    "{edge}/{size}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn tiles_cover_exactly_and_evenly(
            width in 1u32..5000, height in 1u32..5000, cols in 1u32..40, rows in 1u32..40,
        ) {
            prop_assume!(cols <= width && rows <= height);
            let tiles = split(width, height, Grid { cols, rows }, 1600).unwrap();
            prop_assert_eq!(tiles.len() as u32, cols * rows);
            let frame = Rect { x: 0, y: 0, w: width, h: height };
            let area: u64 = tiles.iter().map(|t| u64::from(t.w) * u64::from(t.h)).sum();
            prop_assert_eq!(area, u64::from(width) * u64::from(height));
            // Row-major: each tile starts where its left and upper neighbours end.
            let grid: Vec<&[Rect]> = tiles.chunks(cols as usize).collect();
            for (r, row) in grid.iter().enumerate() {
                for (c, t) in row.iter().enumerate() {
                    prop_assert!(t.w >= 1 && t.h >= 1);
                    prop_assert!(frame.contains(*t));
                    let left = if c == 0 { 0 } else { row[c - 1].right() };
                    let top = if r == 0 { 0 } else { grid[r - 1][c].bottom() };
                    prop_assert_eq!((t.x, t.y), (left, top));
                }
            }
            prop_assert_eq!(tiles[cols as usize - 1].right(), width);
            prop_assert_eq!(tiles.last().unwrap().bottom(), height);
            let (wmin, wmax) = (tiles.iter().map(|t| t.w).min().unwrap(), tiles.iter().map(|t| t.w).max().unwrap());
            let (hmin, hmax) = (tiles.iter().map(|t| t.h).min().unwrap(), tiles.iter().map(|t| t.h).max().unwrap());
            prop_assert!(wmax - wmin <= 1 && hmax - hmin <= 1);
        }

        #[test]
        fn border_renders_exactly_the_overscanned_tile(
            width in 1u32..20000, height in 1u32..20000, cols in 1u32..16, rows in 1u32..16,
            overscan in 0u32..64,
        ) {
            prop_assume!(cols <= width && rows <= height);
            for tile in split(width, height, Grid { cols, rows }, 256).unwrap() {
                let r = with_overscan(tile, overscan, width, height);
                prop_assert!(r.contains(tile));
                let b = blender_border(r, width, height);
                prop_assert_eq!(blender_rect(b, width, height), r);
            }
        }
    }
}
