import XCTest
@testable import Idempo

final class SmokeTests: XCTestCase {
    func testGenerate() throws {
        let key = IdempotencyKey.generate()
        XCTAssertEqual(key.text.count, 36)
    }
}
